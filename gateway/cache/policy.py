"""Which requests the cache covers and what the client asked of it: the policy per model, the mode's
test, and the `Cache-Control` directives the cache honours (docs/cache.md)."""

from __future__ import annotations

from typing import Final

from gateway.cache.key import backend_of, model_tag, targets_of
from gateway.cache.store import Store
from gateway.config import CacheConfig, LoadedConfig
from wire.errors import GatewayError
from wire.schema import CompletionRequest

HIT: Final = "hit"
MISS: Final = "miss"
COALESCED: Final = "coalesced"
BYPASS: Final = "bypass"


class Policy:
    """One `cache` block, as the request path reads it: compiled once per pipeline, shared by its models."""

    __slots__ = ("mode", "ttl_s", "max_entry_bytes", "shared", "store", "scope", "always", "memory", "plain")

    def __init__(self, cfg: CacheConfig, store: Store) -> None:
        self.mode = cfg.mode
        self.ttl_s = cfg.ttl_s
        self.max_entry_bytes = cfg.max_entry_bytes
        self.shared = cfg.scope == "shared"
        self.store = store
        self.scope = SHARED_SCOPE if self.shared else b""  # a tenant's scope is its key's (`Cache.scope`)
        self.always = cfg.mode == "always"  # every request covered, whatever its sampling
        self.memory = store.kind == "memory"  # read without a coroutine
        self.plain = self.always and self.memory  # every request covered, in memory: `Cache.lookup`'s fast path


SHARED_SCOPE: Final = b"*\x00"


class Policies:
    """Which policy covers each model, resolved from the `cache` blocks once per model name: an alias's
    own block, else its first target's provider's, else the top-level one; a direct `vendor/model` name
    its provider's, else the top-level one."""

    def __init__(self, loaded: LoadedConfig, memory: Store, redis: Store | None) -> None:
        cfg = loaded.config

        def policy(block: CacheConfig) -> Policy | None:
            if block.mode == "off":
                return None
            return Policy(block, redis if block.store == "redis" and redis is not None else memory)

        self.default = policy(cfg.cache)
        self.providers = {n: policy(p.cache) for n, p in loaded.providers.items() if p.cache is not None}
        self.aliases: dict[str, Policy | None] = {}
        for alias in cfg.models:
            if alias.cache is not None:
                self.aliases[alias.name] = policy(alias.cache)
            else:
                vendor = alias.targets[0].model.partition("/")[0]
                self.aliases[alias.name] = self.providers.get(vendor, self.default)
        # Per provider: what identifies its servers. Per alias: what its keys end with, so that its answers serve
        # only while it names the same targets on the same servers (a `vendor/model` name's: `of`).
        self.backends = {name: backend_of(p) for name, p in loaded.providers.items()}
        self.targets = {alias.name: targets_of([t.model for t in alias.targets], self.backends) for alias in cfg.models}
        # Per model name: its policy, model tag and what its keys end with.
        self.known: dict[str, tuple[Policy | None, str, bytes]] = {}
        self.scopes: dict[str | None, bytes] = {}  # per API key identity (`ClientKey.ident`): its tenant scope

    def policy(self, model: str) -> Policy | None:
        found = self.aliases.get(model, self)
        if found is not self:
            return found  # type: ignore[return-value]
        return self.providers.get(model.partition("/")[0], self.default)

    def of(self, model: str) -> tuple[Policy | None, str, bytes]:
        """`model`'s policy, tag and key suffix, resolved once (`known` is probed first on the request path)."""
        if len(self.known) >= 4096:
            self.known.clear()  # client-chosen model names cannot grow it
        pol = self.policy(model)
        targets = self.targets.get(model) if pol is not None else b""
        if targets is None:
            targets = targets_of([model], self.backends)
        known = self.known[model] = (pol, model_tag(model), targets)
        return known

    def scope(self, pol: Policy, key: str | None) -> bytes:
        """What prefixes a request's canonical encoding: `*` when shared, else the API key's identity (a runtime
        key's id, a YAML key's fingerprint of its secret: never its name, which another key may share)."""
        if pol.shared:
            return SHARED_SCOPE
        scope = self.scopes.get(key)
        if scope is None:
            if len(self.scopes) >= 4096:
                self.scopes.clear()  # bounded like the keys a config names
            scope = self.scopes[key] = b"key:%s\x00" % (key or "").encode("utf-8", "surrogatepass")
        return scope


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


__all__ = [
    "BYPASS",
    "COALESCED",
    "HIT",
    "MISS",
    "NO_CONTROLS",
    "Policies",
    "SHARED_SCOPE",
    "Controls",
    "Policy",
    "cache_miss",
    "deterministic",
]
