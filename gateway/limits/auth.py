"""Client keys: who may call the gateway and which models each key may use.

Keys are looked up by their SHA-256 digest and then compared with `hmac.compare_digest`, so a lookup's
timing says nothing about how much of a wrong key was right. A key whose `${VAR}` is unset can never
match, but still counts as configured: a missing secret must not turn the gateway open.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

import msgspec

from gateway.config import LoadedConfig
from gateway.limits.globs import ModelGlobs
from wire.errors import AuthenticationError, PermissionDeniedError

if TYPE_CHECKING:
    # Not at run time: the CLI imports this module before Granian forks its workers, and gateway.ratelimit
    # imports gateway.ids, whose per-process id prefix must be drawn in each worker.
    from gateway.limits.ratelimit import Bucket


class ClientKey(msgspec.Struct, frozen=True):
    name: str
    secret: bytes  # empty for a runtime key: the ledger keeps only its digest
    models: ModelGlobs
    digest: bytes = b""
    # Runtime keys (gateway/ledger/keys.py): the key's expiry, or a rotated secret's end of grace.
    valid_until: float | None = None
    max_cost_per_day: float | None = None
    # A runtime key's own rate limits and queue (a YAML key's are gateway/limits/admission.py's, by name).
    buckets: tuple[Bucket, ...] = ()
    max_cost_per_month: float | None = None
    queue_ms: int = 0


class RuntimeKeys:
    """The ledger's keys, shared by every pipeline of the process; `by_digest` is replaced whole on a change."""

    by_digest: dict[bytes, ClientKey] = {}


class KeyRing:
    def __init__(self, loaded: LoadedConfig) -> None:
        self._by_digest: dict[bytes, ClientKey] = {}
        self.configured = bool(loaded.config.keys)
        self.runtime: RuntimeKeys | None = None  # set by the app when the ledger is on
        self.disabled: list[str] = []
        for i, k in enumerate(loaded.config.keys):
            if loaded.missing_for(f"keys[{i}].key") or not k.key:
                self.disabled.append(k.name)
                continue
            secret = k.key.encode()
            digest = hashlib.sha256(secret).digest()
            self._by_digest[digest] = ClientKey(k.name, secret, ModelGlobs(k.models), digest)

    @property
    def open(self) -> bool:
        return not self.configured and (self.runtime is None or not self.runtime.by_digest)

    def authenticate(self, headers: Mapping[str, str]) -> ClientKey | None:
        """The calling key, or None when the gateway is open; raises 401 otherwise."""
        runtime = self.runtime
        if not self.configured and (runtime is None or not runtime.by_digest):
            return None
        presented = _presented_key(headers)
        if not presented:
            raise AuthenticationError(
                "Missing API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'",
                code="missing_api_key",
            )
        digest = hashlib.sha256(presented.encode()).digest()
        key = self._by_digest.get(digest)
        if key is None and runtime is not None:
            key = runtime.by_digest.get(digest)
        if key is None or not hmac.compare_digest(key.digest, digest):
            raise AuthenticationError("Incorrect API key provided", code="invalid_api_key")
        if key.valid_until is not None and key.valid_until <= time.time():
            raise AuthenticationError("This API key has expired", code="invalid_api_key")
        return key

    def named(self, name: str) -> ClientKey | None:
        """The key called `name` (YAML or runtime), for work done on its behalf without its secret (a batch)."""
        runtime: list[ClientKey] = list(self.runtime.by_digest.values()) if self.runtime is not None else []
        for key in [*self._by_digest.values(), *runtime]:
            if key.name == name:
                return key
        return None

    @staticmethod
    def authorize(key: ClientKey | None, model: str) -> None:
        if key is not None and not key.models.match(model):
            raise PermissionDeniedError(
                f"Key '{key.name}' may not use model '{model}'", param="model", code="model_not_allowed"
            )


def _presented_key(headers: Mapping[str, str]) -> str | None:
    auth = headers.get("authorization")
    if auth:
        scheme, _, token = auth.partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip()
    key = headers.get("x-api-key")
    return key.strip() if key else None
