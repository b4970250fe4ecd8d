"""Client keys: who may call the gateway and which models each key may use (its own and its team's `models`).

Keys are looked up by their SHA-256 digest and then compared with `hmac.compare_digest`, so a lookup's timing
says nothing about how much of a wrong key was right. The digest of a presented key that authenticated is
remembered (`KeyRing._known`), so a key's SHA-256 runs once, not on every request. A key whose `${VAR}` is
unset can never match, but still counts as configured: a missing secret must not turn the gateway open.

A key is an identity, not a name (`ClientKey.ident`): a runtime key's id, or for a YAML key a fingerprint
of its secret, so the cache's tenant scope and the ledger's rows tell apart two keys named alike (a YAML
key and a later runtime key, or the keys of two differently configured gateways sharing one Redis). A key of
a team is held to its team's `models` in this ring's config, bound once per key and config (`KeyRing._held`);
a runtime key whose team that config does not declare is refused (`team_undeclared`), decided at that binding.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Final

import msgspec

from gateway.config import LimitsConfig, LoadedConfig
from gateway.limits.globs import ModelGlobs
from wire.errors import AuthenticationError, PermissionDeniedError, shown

if TYPE_CHECKING:
    # Not at run time: the CLI imports this module before Granian forks its workers, and gateway.ratelimit
    # imports gateway.ids, whose per-process id prefix must be drawn in each worker.
    from gateway.limits.ratelimit import Bucket


_ID_SALT: Final = b"completions-gateway key id"
# A slow derivation: the fingerprint is stored in the ledger and shown in reports, and a short YAML secret
# must not be found from it by trying candidates at a hash's speed. About 4 ms a key, once per secret.
_ID_ROUNDS: Final = 10_000
_fingerprints: dict[bytes, str] = {}
# Presented keys remembered with their digest (`KeyRing._known`): emptied when full. Only keys that authenticated
# go in, so wrong keys, random or not, never grow it nor stay in memory.
_KNOWN_MAX: Final = 1024
_EXPIRED: Final = "This API key has expired"
RUNTIME_ID: Final = "key_"  # how every runtime key's id starts (a YAML key's identity starts `cfg_`)


def shown_as(name: str, team: str | None, ident: str) -> str:
    """How keys are told apart where one name could stand for two: a runtime key of a team as `team/name` (each
    team names its keys in a namespace of its own), any other key by its name, which the config and the
    operator's runtime keys of no team share (gateway/ledger/namespaces.py). Neither holds a `/`."""
    if not team or not ident.startswith(RUNTIME_ID):
        return name
    return f"{team}/{name}"


def fingerprint(secret: bytes) -> str:
    """A YAML key's identity: `cfg_` and 16 hex digits derived from its secret (the secret cannot be read back)."""
    found = _fingerprints.get(secret)
    if found is None:
        if len(_fingerprints) >= 4096:
            _fingerprints.clear()
        derived = hashlib.pbkdf2_hmac("sha256", secret, _ID_SALT, _ID_ROUNDS)
        found = _fingerprints[secret] = "cfg_" + derived[:8].hex()
    return found


class ClientKey(msgspec.Struct, frozen=True):
    name: str
    secret: bytes  # empty for a runtime key: the ledger keeps only its digest
    # Its own `models`; as `KeyRing` hands it out, held `within` its team's too (the config in force's).
    models: ModelGlobs
    digest: bytes = b""
    # Runtime keys (gateway/ledger/keys.py): the key's expiry, or a rotated secret's end of grace.
    valid_until: float | None = None
    max_cost_per_day: float | None = None
    # A runtime key's own rate limits and queue (a YAML key's are gateway/limits/admission.py's, by name).
    buckets: tuple[Bucket, ...] = ()
    max_cost_per_month: float | None = None
    queue_ms: int = 0
    # Who the key is (a runtime key's id, a YAML key's `fingerprint`): the cache's tenant scope and the
    # ledger's `key_id`. Its team as configured now: a row is booked under the team of the moment it ran.
    ident: str = ""
    team: str | None = None
    # A runtime key's share of a saturated server (a YAML key's are read by the queue from the config).
    weight: float = 1.0
    priority: str | None = None
    max_priority: str | None = None
    # A runtime key's own limits of its batch lines, in place of `batches.limits` (a YAML key's are admission's).
    batch_limits: LimitsConfig | None = None
    # The key among every key in force (`shown_as`): what per-key state outside the ledger is keyed by and what
    # the operator's views name it. Read on every request, so worked out once, whenever a key is built or copied
    # (`msgspec.structs.replace` runs `__post_init__` too): never passed in, never stale.
    label: str = ""

    def __post_init__(self) -> None:
        msgspec.structs.force_setattr(self, "label", shown_as(self.name, self.team, self.ident))


class RuntimeKeys:
    """The ledger's keys, shared by every pipeline of the process; `by_digest` is replaced whole on a change.
    `ever`: the ledger has held a runtime key (revoked or not), which keeps a gateway without YAML keys
    closed under `keyless: auto`."""

    by_digest: dict[bytes, ClientKey] = {}
    ever: bool = False


def team_undeclared(key: ClientKey) -> PermissionDeniedError:
    """The refusal of a runtime key whose team the config in force does not declare: on every client route and
    for its batch's lines, until a config declares the team again."""
    return PermissionDeniedError(
        f"Key '{key.name}' is of team '{key.team}', which the gateway's config does not declare: "
        "the key is refused until its team is declared again",
        code="team_undeclared",
    )


def keyless_open(keyless: str, configured: bool, live: bool, ever: bool) -> bool:
    """Whether requests without a key are served: no key in force (`configured`: YAML keys; `live`: runtime
    keys), and `keyless` allows it (`auto`: while the ledger never held a runtime key, so revoking the last
    one never opens the gateway)."""
    if configured or live or keyless == "closed":
        return False
    return keyless == "open" or not ever


OPEN_LINE: Final = "no client keys configured: the gateway is open to anyone who can reach it"


def door(keyless: str, yaml_keys: int, runtime_keys: int | None, ever: bool) -> str:
    """The log line saying whether the gateway serves requests without a key; `runtime_keys` None: no ledger."""
    if keyless_open(keyless, bool(yaml_keys), bool(runtime_keys), ever):
        return OPEN_LINE
    found = f"{yaml_keys} in the config" + (
        "" if runtime_keys is None else f", {runtime_keys} runtime key(s) in the ledger"
    )
    why = ""
    if not yaml_keys and not runtime_keys:
        why = " (keyless: closed)" if keyless == "closed" else " (the ledger has held runtime keys; keyless: auto)"
    return f"client keys: {found}{why}: requests without a key are refused"


class KeyRing:
    def __init__(self, loaded: LoadedConfig) -> None:
        self._by_digest: dict[bytes, ClientKey] = {}
        self.configured = bool(loaded.config.keys)
        self.keyless = loaded.config.keyless
        self.runtime: RuntimeKeys | None = None  # set by the app when the ledger is on
        self.disabled: list[str] = []
        # A presented key that authenticated -> its digest: the SHA-256 skipped when the same key comes again.
        # The digest is still looked up in the key tables in force, so a key revoked or expired since is refused
        # as before; the map is emptied when the runtime keys change, so it keeps no secret of a revoked key. A
        # wrong key is never in it, and a probe's timing cannot tell how much of one was right: a dict compares
        # the text only once its (per-process keyed) hash matched in full.
        self._known: dict[str, bytes] = {}
        self._known_for: Mapping[bytes, ClientKey] | None = None  # the runtime table `_known` was filled under
        self.daily: dict[str, float | None] = {k.name: k.max_cost_per_day for k in loaded.config.keys}
        self._team_of: dict[str, str | None] = {k.name: k.team for k in loaded.config.keys}
        # A runtime key naming a team the config does not declare is refused (gateway/ledger/keys.py warns of
        # such keys): it would otherwise run with no team ceiling, limits or budget, wider than its team allowed.
        self.teams = frozenset(loaded.config.teams)
        # Each team's `models` that allows less than every model.
        self.ceilings: dict[str, ModelGlobs] = {
            name: ModelGlobs(t.models) for name, t in loaded.config.teams.items() if "**" not in t.models
        }
        # The runtime keys in force with their team's ceiling bound, and the table they were made from; the
        # table's keys of an undeclared team, apart: looked up only when a digest is not among those in force.
        self._bound: Mapping[bytes, ClientKey] | None = None
        self._strays: Mapping[bytes, ClientKey] = {}
        self._bound_for: dict[bytes, ClientKey] | None = None
        for i, k in enumerate(loaded.config.keys):
            if loaded.missing_for(f"keys[{i}].key") or not k.key:
                self.disabled.append(k.name)
                continue
            secret = k.key.encode()
            digest = hashlib.sha256(secret).digest()
            ident = fingerprint(secret)
            models = ModelGlobs(k.models).within(self.ceilings.get(k.team) if k.team is not None else None)
            self._by_digest[digest] = ClientKey(k.name, secret, models, digest, ident=ident, team=k.team)

    @property
    def open(self) -> bool:
        """Whether requests without a key are served (`keyless_open`)."""
        runtime = self.runtime
        live, ever = (bool(runtime.by_digest), runtime.ever) if runtime is not None else (False, False)
        return keyless_open(self.keyless, self.configured, live, ever)

    def roster(self, team: str | None = None) -> dict[str, float | None]:
        """Every key in force (YAML keys, disabled ones too, and runtime keys), with its daily budget, by its
        `label`; with a `team`, that team's keys alone, by name (the team's own namespace)."""
        out = {n: b for n, b in self.daily.items() if team is None or self._team_of[n] == team}
        if self.runtime is not None:
            for k in self.runtime.by_digest.values():
                if team is None or k.team == team:
                    out.setdefault(k.name if team is not None else k.label, k.max_cost_per_day)
        return out

    def _runtime_keys(self) -> Mapping[bytes, ClientKey] | None:
        """The runtime keys in force, each held to its team's ceiling under this ring's config, without those whose
        team it does not declare (`_strays`): bound again only when the poller replaced the table (the same
        table, the same keys)."""
        runtime = self.runtime
        table = runtime.by_digest if runtime is not None else None
        if table is not self._bound_for:
            self._bound_for = table
            teams = self.teams
            strays = (
                {} if table is None else {d: k for d, k in table.items() if k.team is not None and k.team not in teams}
            )
            self._strays = strays
            if table is None or (not self.ceilings and not strays):
                self._bound = table
            else:
                self._bound = {d: self._held(k) for d, k in table.items() if d not in strays}
        return self._bound

    def _held(self, key: ClientKey) -> ClientKey:
        ceiling = self.ceilings.get(key.team) if key.team is not None else None
        return key if ceiling is None else msgspec.structs.replace(key, models=key.models.within(ceiling))

    def describe(self) -> str:
        """One line for the log: whether the gateway is open to requests without a key, and why."""
        runtime = self.runtime
        if runtime is None:
            return door(self.keyless, len(self.daily), None, False)
        return door(self.keyless, len(self.daily), len({k.ident for k in runtime.by_digest.values()}), runtime.ever)

    def authenticate(self, headers: Mapping[str, str]) -> ClientKey | None:
        """The calling key, or None when the gateway is open; raises 401 otherwise."""
        runtime = self.runtime
        if not self.configured and (runtime is None or not runtime.by_digest) and self.open:  # rare: no key in force
            return None
        table = self._runtime_keys()
        known = self._known
        if table is not self._known_for:
            known.clear()  # runtime keys changed: no revoked key's text stays here
            self._known_for = table
        presented = presented_key(headers)
        if not presented:
            raise AuthenticationError(
                "Missing API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'",
                code="missing_api_key",
            )
        digest = known.get(presented)
        remember = digest is None
        if digest is None:
            digest = hashlib.sha256(presented.encode()).digest()
        key = self._by_digest.get(digest)
        if key is None and table is not None:
            key = table.get(digest)
        if key is None or not hmac.compare_digest(key.digest, digest):
            stray = self._strays.get(digest)
            if stray is None or not hmac.compare_digest(stray.digest, digest):
                raise AuthenticationError("Incorrect API key provided", code="invalid_api_key")
            if stray.valid_until is not None and stray.valid_until <= time.time():
                raise AuthenticationError(_EXPIRED, code="invalid_api_key")  # told first: no reload undoes it
            raise team_undeclared(stray)
        if remember:
            if len(known) >= _KNOWN_MAX:
                known.clear()
            known[presented] = digest
        if key.valid_until is not None and key.valid_until <= time.time():
            raise AuthenticationError(_EXPIRED, code="invalid_api_key")
        return key

    def identified(self, ident: str) -> ClientKey | None:
        """The key in force whose identity is `ident` (YAML or runtime), for work done on its behalf without its
        secret (a batch): never another key that merely shares its name."""
        bound = self._runtime_keys()
        runtime: list[ClientKey] = list(bound.values()) if bound is not None else []
        for key in [*self._by_digest.values(), *runtime]:
            if key.ident == ident:
                return key
        return None

    def stray(self, ident: str) -> ClientKey | None:
        """The runtime key whose identity is `ident` when it is refused because this ring's config does not
        declare its team (`team_undeclared`), for its batch's lines; None otherwise."""
        self._runtime_keys()
        for key in self._strays.values():
            if key.ident == ident:
                return key
        return None

    def yaml_idents(self, team: str) -> list[str]:
        """The identities of the YAML keys in force of `team` (the config alone knows a YAML key's team; a
        runtime key's is in the ledger's `api_keys`)."""
        return sorted(k.ident for k in self._by_digest.values() if k.team == team)

    def name_of(self, ident: str, team: str | None = None) -> str:
        """The key in force (or refused for its undeclared team) whose identity is `ident` as an admin names it:
        by its `label` for the operator (`team` None), by its name for its team's admin (the team's namespace);
        the identity itself for a key no longer in force (and `anonymous` for the keyless)."""
        key = self.identified(ident) or self.stray(ident)
        if key is None:
            return ident
        return key.label if team is None else key.name

    @staticmethod
    def authorize(key: ClientKey | None, model: str) -> None:
        if key is not None and not key.models.match(model):
            ceiling = key.models.ceiling
            why = "" if ceiling is None or ceiling.match(model) else f" (team '{key.team}' may not)"
            raise PermissionDeniedError(
                f"Key '{key.name}' may not use model '{shown(model)}'{why}", param="model", code="model_not_allowed"
            )


def presented_key(headers: Mapping[str, str]) -> str | None:
    auth = headers.get("authorization")
    if auth:
        scheme, _, token = auth.partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip()
    key = headers.get("x-api-key")
    return key.strip() if key else None
