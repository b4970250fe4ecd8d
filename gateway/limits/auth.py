"""Client keys: who may call the gateway and which models each key may use.

Keys are looked up by their SHA-256 digest and then compared with `hmac.compare_digest`, so a lookup's
timing says nothing about how much of a wrong key was right. A key whose `${VAR}` is unset can never
match, but still counts as configured: a missing secret must not turn the gateway open.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping

import msgspec

from gateway.config import LoadedConfig
from gateway.limits.globs import ModelGlobs
from wire.errors import AuthenticationError, PermissionDeniedError


class ClientKey(msgspec.Struct, frozen=True):
    name: str
    secret: bytes
    models: ModelGlobs


class KeyRing:
    def __init__(self, loaded: LoadedConfig) -> None:
        self._by_digest: dict[bytes, ClientKey] = {}
        self.configured = bool(loaded.config.keys)
        self.disabled: list[str] = []
        for i, k in enumerate(loaded.config.keys):
            if loaded.missing_for(f"keys[{i}].key") or not k.key:
                self.disabled.append(k.name)
                continue
            secret = k.key.encode()
            self._by_digest[hashlib.sha256(secret).digest()] = ClientKey(k.name, secret, ModelGlobs(k.models))

    @property
    def open(self) -> bool:
        return not self.configured

    def authenticate(self, headers: Mapping[str, str]) -> ClientKey | None:
        """The calling key, or None when the gateway is open; raises 401 otherwise."""
        if not self.configured:
            return None
        presented = _presented_key(headers)
        if not presented:
            raise AuthenticationError(
                "Missing API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'",
                code="missing_api_key",
            )
        raw = presented.encode()
        key = self._by_digest.get(hashlib.sha256(raw).digest())
        if key is None or not hmac.compare_digest(key.secret, raw):
            raise AuthenticationError("Incorrect API key provided", code="invalid_api_key")
        return key

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
