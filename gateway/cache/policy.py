"""Which requests the cache covers and what the client asked of it: the policy per model, the mode's
test, and the `Cache-Control` directives the cache honours (docs/cache.md)."""

from __future__ import annotations

from typing import Final

from gateway.cache.store import Store
from gateway.config import CacheConfig
from wire.errors import GatewayError
from wire.schema import CompletionRequest

HIT: Final = "hit"
MISS: Final = "miss"
COALESCED: Final = "coalesced"
BYPASS: Final = "bypass"


class Policy:
    __slots__ = ("mode", "ttl_s", "max_entry_bytes", "shared", "store")

    def __init__(self, cfg: CacheConfig, store: Store) -> None:
        self.mode = cfg.mode
        self.ttl_s = cfg.ttl_s
        self.max_entry_bytes = cfg.max_entry_bytes
        self.shared = cfg.scope == "shared"
        self.store = store


class Controls:
    """The request's `Cache-Control` directives that the cache honours."""

    __slots__ = ("no_cache", "no_store", "only_if_cached", "max_age")

    def __init__(self, header: str | None) -> None:
        self.no_cache = self.no_store = self.only_if_cached = False
        self.max_age: int | None = None
        if not header:
            return
        for part in header.lower().split(","):
            name, _, value = part.strip().partition("=")
            if name == "no-cache":
                self.no_cache = True
            elif name == "no-store":
                self.no_store = True
            elif name == "only-if-cached":
                self.only_if_cached = True
            elif name == "max-age":
                try:
                    self.max_age = max(int(value.strip().strip('"')), 0)
                except ValueError:
                    raise GatewayError(
                        "Cache-Control max-age must be a whole number of seconds",
                        status=400,
                        type="invalid_request_error",
                        code="invalid_cache_control",
                    ) from None


NO_CONTROLS: Final = Controls(None)


def deterministic(req: CompletionRequest) -> bool:
    """Whether sampling cannot change the answer: temperature 0, a seed, or nothing generated."""
    return req.temperature == 0 or req.seed is not None or req.max_tokens == 0


def cache_miss() -> GatewayError:
    return GatewayError(
        "No cached answer for this request, and Cache-Control: only-if-cached forbids asking the upstream",
        status=504,
        code="cache_miss",
    )


__all__ = ["BYPASS", "COALESCED", "HIT", "MISS", "NO_CONTROLS", "Controls", "Policy", "cache_miss", "deterministic"]
