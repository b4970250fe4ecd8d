"""Client keys made at runtime (`/admin/keys`), stored in the ledger beside the YAML ones.

The ledger keeps a key's SHA-256 and a stable public id, never its secret: the secret is shown once,
when the key is made or rotated. A rotation keeps the previous secret valid until its grace ends, and
every earlier secret until its own (table `key_secrets`): a second rotation never cuts the first one's
grace short. A key's identity is its id, which a rotation keeps (`ClientKey.ident`). Every
change bumps one counter in the same transaction; each replica reads that counter every
`ledger.keys_poll_ms` and reloads the keys only when it moved, so a new, rotated or revoked key applies
on every replica within that time while authentication stays one dictionary lookup.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import secrets
import time
from collections.abc import Callable, Collection
from typing import Any, Final

import msgspec

from gateway.config import QUEUE_MAX_MS, RATE_MAX, WEIGHT_MIN, LimitsConfig, ModelNames, Priority
from gateway.ledger.book import Ledger
from gateway.ledger.engine import Cursor, LedgerDown
from gateway.ledger.namespaces import YamlKeys, takes_yaml_name
from gateway.limits.admission import buckets_of
from gateway.limits.auth import RUNTIME_ID, ClientKey, RuntimeKeys, shown_as
from gateway.limits.globs import ModelGlobs

log = logging.getLogger("gateway")

_FIELDS: Final = (
    "id, name, team, models, max_cost_per_day, expires_at, digest, old_digest, old_valid_until, created_at, limits, "
    "max_cost_per_month, weight, priority, max_priority, batch_limits"
)
# A key's share of a saturated server: weight, default priority, highest priority it may ask for.
Share = tuple[float, "Priority | None", "Priority | None"]
# Each bounded field of a key's `limits` and its bound (gateway/config/schema.py's).
_BOUNDS: Final = {
    "rps": RATE_MAX,
    "rpm": RATE_MAX,
    "tpm": RATE_MAX,
    "tpd": RATE_MAX,
    "concurrent": RATE_MAX,
    "max_queue_ms": QUEUE_MAX_MS,
}
# Earlier secrets of one key still in their grace at most: each is one more key in force in every replica's
# memory, read again at every change, so rotations in a row with a grace would grow them without end. Past it a
# rotation with a grace is refused; one with `grace_s: 0` (a leaked secret) never is.
MAX_GRACE_SECRETS: Final = 16
_DAY_S: Final = 86_400
_BUMP: Final = "UPDATE counters SET value = value + 1 WHERE name = 'keys'"
_SPACE: Final = "coalesce(team, '')"  # a key's namespace, as the unique index `api_keys_team_name` reads it


class KeyRow(msgspec.Struct, frozen=True):
    """A runtime key as `GET /admin/keys` lists it (no secret, no digest)."""

    id: str
    name: str
    team: str | None
    models: list[str]
    max_cost_per_day: float | None
    expires_at: float | None
    created_at: float
    rotated_grace_until: float | None = None
    limits: LimitsConfig | None = None
    max_cost_per_month: float | None = None
    weight: float = 1.0
    priority: Priority | None = None
    max_priority: Priority | None = None
    batch_limits: LimitsConfig | None = None


class Issued(msgspec.Struct, frozen=True):
    """A key and its secret: the only answer that ever holds the secret."""

    key: KeyRow
    secret: str


class KeyConflict(Exception):
    pass


class KeyNotFound(Exception):
    pass


class TooManyKeys(Exception):
    pass


class TooManySecrets(Exception):
    pass


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _secret() -> str:
    return "gwk-" + secrets.token_urlsafe(32)


def _row(r: tuple[Any, ...], grace: dict[str, float]) -> KeyRow:
    return KeyRow(
        id=r[0],
        name=r[1],
        team=r[2],
        models=msgspec.json.decode(r[3], type=list[str]),
        max_cost_per_day=r[4],
        expires_at=r[5],
        created_at=r[9],
        rotated_grace_until=grace.get(r[0]),
        limits=_limits(r[10]),
        max_cost_per_month=r[11],
        weight=1.0 if r[12] is None else r[12],
        priority=r[13],
        max_priority=r[14],
        batch_limits=_limits(r[15]),
    )


def _stored(limits: LimitsConfig | None) -> str | None:
    return None if limits is None else msgspec.json.encode(limits).decode()


def _limits(stored: str | None) -> LimitsConfig | None:
    if stored is None:
        return None
    # A key made before its limits were bounded may hold more than the bound: it is served at the bound.
    fields = msgspec.json.decode(stored, type=dict[str, Any])
    for kind, bound in _BOUNDS.items():
        if isinstance(fields.get(kind), int) and fields[kind] > bound:
            fields[kind] = bound
    return msgspec.convert(fields, LimitsConfig)


# ---------------------------------------------------------------------------- on the ledger's thread


def create(
    cur: Cursor,
    name: str,
    team: str | None,
    models: list[str],
    max_cost_per_day: float | None,
    expires_at: float | None,
    limits: LimitsConfig | None = None,
    max_cost_per_month: float | None = None,
    share: Share = (1.0, None, None),
    batch_limits: LimitsConfig | None = None,
    most: int | None = None,
) -> Issued:
    """A new key; with `most` (a team admin's `teams.<name>.max_keys`), only while its team holds fewer keys in
    force and has made fewer in the last day (`_count_keys`)."""
    # First: on PostgreSQL the counter's row is then held until commit, so keys made at once on two replicas
    # are counted one after the other (SQLite's BEGIN IMMEDIATE does so), and a team cannot pass `most`.
    cur.execute(_BUMP)
    if most is not None:
        _count_keys(cur, team, most)
    # A name is taken within its team alone (the operator's keys of no team are one more namespace); a revoked
    # key keeps its name, so the rows booked under it are never read as a newer key's.
    taken = cur.rows(f"SELECT id FROM api_keys WHERE name = ? AND {_SPACE} = ?", (name, team or ""))
    if taken:
        raise KeyConflict(_taken(name, team))
    key_id = RUNTIME_ID + secrets.token_hex(8)
    secret = _secret()
    now = round(time.time(), 3)
    # Another replica may make a key of this name between the check and the insert: its unique name wins, and
    # this one is the conflict it would have been a moment later (not a database error).
    cur.execute(
        f"INSERT INTO api_keys ({_FIELDS}) VALUES (?, ?, ?, ?, ?, ?, ?, NULL, NULL, ?, ?, ?, ?, ?, ?, ?)"
        " ON CONFLICT DO NOTHING",
        (key_id, name, team, msgspec.json.encode(models).decode(), max_cost_per_day, expires_at, _digest(secret), now)
        + (_stored(limits), max_cost_per_month, *share, _stored(batch_limits)),
    )
    if not cur.rows("SELECT id FROM api_keys WHERE id = ?", (key_id,)):
        raise KeyConflict(_taken(name, team))
    fields = (key_id, name, team, models, max_cost_per_day, expires_at, now, None, limits, max_cost_per_month)
    row = KeyRow(*fields, *share, batch_limits)
    return Issued(row, secret)


def _count_keys(cur: Cursor, team: str | None, most: int) -> None:
    """`TooManyKeys` when `team` holds `most` keys in force, or made `most` in the last day: a revoked key stays
    in the ledger (its name stays taken), so making and revoking keys in turn would grow it without end."""
    sql = (
        "SELECT coalesce(sum(CASE WHEN revoked_at IS NULL THEN 1 ELSE 0 END), 0), "
        f"coalesce(sum(CASE WHEN created_at > ? THEN 1 ELSE 0 END), 0) FROM api_keys WHERE {_SPACE} = ?"
    )
    held, made = (int(n) for n in cur.rows(sql, (time.time() - _DAY_S, team or ""))[0])
    setting = f"teams.{team}.max_keys"
    if held >= most:
        raise TooManyKeys(f"team {team!r} holds {held} keys, its most ({setting}) {most}: revoke one it no longer uses")
    if made >= most:
        raise TooManyKeys(f"team {team!r} made {made} keys in the last 24 hours, its most ({setting}) {most}")


def _taken(name: str, team: str | None) -> str:
    return f"a key named {name!r} exists already" + ("" if team is None else f" in team {team!r}")


def _of(team: str | None) -> tuple[str, tuple[str, ...]]:
    """The condition (and its argument) that narrows `api_keys` to one team's keys; none for the operator."""
    return (" AND team = ?", (team,)) if team is not None else ("", ())


def rotate(cur: Cursor, key_id: str, grace_s: float, team: str | None = None) -> Issued:
    """A new secret for the key (with a `team`: only if it is that team's; else `KeyNotFound`, as for no key)."""
    if "\x00" in key_id:
        raise KeyNotFound(key_id)  # no id holds one, and PostgreSQL's text refuses it (an error, not a 404)
    # PostgreSQL: the key's row held until commit, so that a rotation made at once elsewhere starts from this
    # one's secret (and keeps it in grace) instead of from the one both found. SQLite's BEGIN IMMEDIATE does so.
    held = " FOR UPDATE" if cur.postgres else ""
    only, args = _of(team)
    found = cur.rows(f"SELECT {_FIELDS} FROM api_keys WHERE id = ? AND revoked_at IS NULL{only}{held}", (key_id, *args))
    if not found:
        raise KeyNotFound(key_id)
    secret = _secret()
    now = time.time()
    until = round(now + grace_s, 3)
    cur.execute("DELETE FROM key_secrets WHERE key_id = ? AND valid_until <= ?", (key_id, now))
    # `grace_s` 0: the secret in force ends now (the rounding of `until` must not keep it a moment longer).
    if grace_s > 0 and until > now:  # the secret in force joins the earlier ones, each valid until its own grace ends
        kept = int(cur.rows("SELECT count(*) FROM key_secrets WHERE key_id = ?", (key_id,))[0][0])
        if kept >= MAX_GRACE_SECRETS:
            raise TooManySecrets(
                f"key {key_id!r} has {kept} earlier secrets still in their grace, the most a key keeps "
                f"({MAX_GRACE_SECRETS}): rotate with grace_s 0, or once the grace of one has ended"
            )
        cur.execute(
            "INSERT INTO key_secrets (digest, key_id, valid_until) SELECT digest, id, ? FROM api_keys WHERE id = ?",
            (until, key_id),
        )
    cur.execute("UPDATE api_keys SET digest = ? WHERE id = ?", (_digest(secret), key_id))
    cur.execute(_BUMP)
    return Issued(_row(found[0], _graces(cur, now)), secret)


def revoke(cur: Cursor, key_id: str, team: str | None = None) -> None:
    """The key revoked (with a `team`: only if it is that team's; else `KeyNotFound`, as for no key)."""
    if "\x00" in key_id:
        raise KeyNotFound(key_id)  # as in `rotate`
    only, args = _of(team)
    sql = f"UPDATE api_keys SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL{only}"
    if not cur.execute(sql, (time.time(), key_id, *args)):
        raise KeyNotFound(key_id)
    cur.execute("DELETE FROM key_secrets WHERE key_id = ?", (key_id,))
    cur.execute(_BUMP)


def _graces(cur: Cursor, now: float) -> dict[str, float]:
    """Per key, when the last of its earlier secrets stops working (keys with one in its grace only)."""
    sql = "SELECT key_id, max(valid_until) FROM key_secrets WHERE valid_until > ? GROUP BY key_id"
    return {r[0]: float(r[1]) for r in cur.rows(sql, (now,))}


def listing(cur: Cursor, team: str | None = None) -> list[KeyRow]:
    """The keys not revoked, oldest first (with a `team`: that team's alone)."""
    grace = _graces(cur, time.time())
    only, args = _of(team)
    rows = cur.rows(f"SELECT {_FIELDS} FROM api_keys WHERE revoked_at IS NULL{only} ORDER BY created_at", args)
    return [_row(r, grace) for r in rows]


def version(cur: Cursor) -> int:
    return int(cur.rows("SELECT value FROM counters WHERE name = 'keys'")[0][0])


class Loaded(msgspec.Struct, frozen=True):
    """The keys in force: their rows, their earlier secrets still in grace, whether any key was ever made."""

    version: int
    rows: list[tuple[Any, ...]]
    secrets: list[tuple[Any, ...]]  # (key_id, digest, valid_until)
    ever: bool


def load(cur: Cursor) -> Loaded:
    # The version first: on PostgreSQL each statement reads what is committed when it starts, so the rows read
    # after it are at least that new. Read last, it could name a change the rows missed, and the poller, having
    # seen that version, would never reload them.
    seen = version(cur)
    rows = cur.rows(f"SELECT {_FIELDS} FROM api_keys WHERE revoked_at IS NULL")
    secrets_ = cur.rows("SELECT key_id, digest, valid_until FROM key_secrets WHERE valid_until > ?", (time.time(),))
    ever = bool(rows) or bool(cur.rows("SELECT 1 FROM api_keys LIMIT 1"))
    return Loaded(seen, rows, secrets_, ever)


# ---------------------------------------------------------------------------- on the event loop


def _ring(rows: list[tuple[Any, ...]], earlier: list[tuple[Any, ...]]) -> dict[bytes, ClientKey]:
    out: dict[bytes, ClientKey] = {}
    by_id: dict[str, ClientKey] = {}
    for r in rows:
        models = ModelGlobs(msgspec.json.decode(r[3], type=list[str]))
        expires = r[5]
        digest = bytes.fromhex(r[6])
        limits = _limits(r[10])
        # Named by its label: two teams' keys of one name are told apart, and neither meets a YAML key's queue.
        buckets = tuple(buckets_of(f"key:{shown_as(r[1], r[2], r[0])}", limits, f"key:{r[0]}"))
        queue_ms = limits.max_queue_ms if limits is not None else 0
        key = ClientKey(
            r[1],
            b"",
            models,
            digest,
            expires,
            r[4],
            buckets,
            r[11],
            queue_ms,
            ident=r[0],
            team=r[2],
            # A key made before weights were bounded below is served at the bound, as its limits are.
            weight=1.0 if r[12] is None else max(r[12], WEIGHT_MIN),
            priority=r[13],
            max_priority=r[14],
            batch_limits=_limits(r[15]),
        )
        out[digest] = by_id[r[0]] = key
    now = time.time()
    for key_id, old_hex, grace_until in earlier:
        current = by_id.get(key_id)
        if current is None:
            continue
        expires = current.valid_until
        until = grace_until if expires is None else min(grace_until, expires)
        if until > now:
            old = bytes.fromhex(old_hex)
            out[old] = msgspec.structs.replace(current, digest=old, valid_until=until)
    return out


class KeyPoller:
    """Keeps `runtime` equal to the ledger's keys: reads the version every `keys_poll_ms`, reloads on a change."""

    def __init__(
        self,
        ledger: Ledger,
        runtime: RuntimeKeys,
        yaml: YamlKeys,
        on_change: Callable[[], None] | None = None,
        teams: Collection[str] | None = None,
        models: ModelNames | None = None,
    ) -> None:
        self.ledger = ledger
        self.runtime = runtime
        self.yaml = yaml
        self.teams = None if teams is None else frozenset(teams)
        self.models = models
        self.on_change = on_change
        self.seen = -1
        self._strays: list[tuple[str, str]] = []  # (key, team) last logged as naming an undeclared team
        self._stray_patterns: list[tuple[str, str]] = []  # (key, why) last logged as matching nothing routed
        self._task: asyncio.Task[None] | None = None

    def names(self, yaml: YamlKeys, teams: Collection[str] | None = None, models: ModelNames | None = None) -> None:
        """The YAML keys, the teams and what the config in force (a reload's) routes: runtime keys that take a
        YAML key's name in their namespace are ignored, and those whose team it no longer declares, or with a
        `models` pattern it routes nothing to, are logged, from the next poll on."""
        declared = None if teams is None else frozenset(teams)
        routed = None if models is None else models.routes
        before = None if self.models is None else self.models.routes
        if yaml != self.yaml or declared != self.teams or routed != before:
            self.yaml = yaml
            self.teams = declared
            self.models = models
            self.seen = -1

    async def refresh(self, *, force: bool = False) -> None:
        if not force:
            current = await self.ledger.call(self.ledger.db.snapshot, version)
            if current == self.seen:
                return
        found: Loaded = await self.ledger.call(self.ledger.db.snapshot, load)
        rows = found.rows
        clash = sorted(shown_as(r[1], r[2], r[0]) for r in rows if takes_yaml_name(r[1], r[2], self.yaml))
        if clash:
            # Refused at start-up and by `POST /admin/keys`; here when a reload (or a replica's YAML) named
            # a key like a runtime one of its namespace: the YAML key wins, and the runtime key stops working.
            log.error("ledger: runtime key name(s) %s also in keys: (YAML); those runtime keys are ignored", clash)
            rows = [r for r in rows if not takes_yaml_name(r[1], r[2], self.yaml)]
        self._stray_teams(rows)
        self._stray_models(rows)
        self.runtime.by_digest = _ring(rows, found.secrets)
        self.runtime.ever = found.ever
        self.seen = found.version
        if self.on_change is not None:
            self.on_change()

    def _stray_teams(self, rows: list[tuple[Any, ...]]) -> None:
        """One WARNING when a runtime key starts naming a team the config does not declare (a reload
        removed the team, or a replica's YAML lacks it). `POST /admin/keys` refuses such a team; a key made
        under it earlier is refused on every client route (403 `team_undeclared`, gateway/limits/auth.py), as
        are its batches' lines, until the team is declared again: it would otherwise run with none of the
        team's budgets, limits or `models`. It is still listed, rotated and revoked as before."""
        if self.teams is None:
            return
        strays = sorted((r[1], r[2]) for r in rows if r[2] is not None and r[2] not in self.teams)
        if set(strays) - set(self._strays):  # named once, not again at every change of the other keys
            shown = ", ".join(f"{key!r} (team {team!r})" for key, team in strays)
            log.warning(
                "ledger: runtime key(s) %s name a team not under teams:; they are refused (403 team_undeclared) "
                "until it is declared again",
                shown,
            )
        self._strays = strays

    def _stray_models(self, rows: list[tuple[Any, ...]]) -> None:
        """One WARNING when a runtime key's `models` starts holding a pattern the config routes nothing to (a
        reload removed the provider or alias it named). `POST /admin/keys` refuses such a pattern; the key keeps
        its other patterns, and this one allows nothing until the config routes it again."""
        if self.models is None:
            return
        strays = []
        for r in rows:
            for j, pattern in enumerate(msgspec.json.decode(r[3], type=list[str])):
                if (why := self.models.problem(pattern)) is not None:
                    strays.append((r[1], f"models[{j}]: {why}"))
        if set(strays) - set(self._stray_patterns):
            shown = "; ".join(f"{key!r} {why}" for key, why in sorted(strays))
            log.warning("ledger: runtime key(s) with a models pattern the config routes nothing to: %s", shown)
        self._stray_patterns = strays

    async def start(self) -> None:
        await self.refresh(force=True)
        self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        interval = self.ledger.cfg.keys_poll_ms / 1000
        while True:
            await asyncio.sleep(interval)
            try:
                await self.refresh()
            except LedgerDown:
                pass  # the keys in force stay; the writer logs the outage
            except Exception:
                log.exception("ledger: reading the runtime keys failed")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
