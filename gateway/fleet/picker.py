"""Which replica of a provider serves a request: the policies, bounded loads, draining and engine load.

`Fleet.choose` is called once per request per replicated provider the plan may use (gateway/resilience/balancer.py),
with each replica's in-flight count from this process and whether it is cooling. It returns the replicas
to try, best first; draining replicas are left out, so they take no new requests while theirs finish.
Rules: docs/fleets.md.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence

import msgspec

from gateway.config import (
    RoutingConfig,
    Scope,
    replica_drained,
    replica_names,
    replica_tag,
    replica_url,
    replica_weight,
)
from gateway.fleet.affinity import Ring, prefix_key, prefix_of, session_key, session_of
from gateway.fleet.tenancy import owner_of
from wire.schema import CompletionRequest

_DEFAULT = RoutingConfig()


class Hint:
    """What a request offers the policies: its prompt, its session (header, else `user`) and who sends it
    (its key's identity and team, empty without them), which scopes its session and its prefix
    (`routing.session_scope`, the provider's `prefix_scope`)."""

    __slots__ = ("req", "headers", "key", "team")

    def __init__(self, req: CompletionRequest, headers: Mapping[str, str], key: str = "", team: str = "") -> None:
        self.req = req
        self.headers = headers
        self.key = key
        self.team = team

    def scope(self, scope: str) -> str:
        """Whose session ids or prefixes the request's are among: its key's, its team's (a key without a team
        is one of its own), or everyone's (empty, as for a gateway without keys)."""
        if scope == "shared" or not self.key:
            return ""
        if scope == "team" and self.team:
            return "team:" + self.team
        return "key:" + self.key

    def owner(self, scope: str) -> bytes:
        """The digest of whom `scope` makes the request one of, keying its ring hashes (empty: shared)."""
        return owner_of(self.scope(scope))[0]


class EngineLoad(msgspec.Struct, frozen=True):
    """One replica's own report of its load, as last read from its `/metrics`."""

    waiting: float
    running: float
    kv_usage: float | None = None


class Fleet:
    """One provider's replicas: their URLs and weights, the policy, and the mutable drain and load state."""

    def __init__(
        self, provider: str, replicas: Sequence[object], routing: RoutingConfig | None, prefix_scope: Scope = "key"
    ) -> None:
        self.provider = provider
        self.routing = routing or _DEFAULT
        # Whose prefixes share a replica under `policy: prefix`: the provider's, as for its engines' salts.
        self.prefix_scope = prefix_scope
        self.urls = [replica_url(r).rstrip("/") for r in replicas]  # type: ignore[arg-type]
        self.weights = [replica_weight(r) for r in replicas]  # type: ignore[arg-type]
        self.names = replica_names(provider, list(replicas))  # type: ignore[arg-type]
        self.draining = [replica_drained(r) for r in replicas]  # type: ignore[arg-type]
        # Flags the drain route set while Redis did not answer, by replica: gateway/fleet/shared.py stores
        # them once it answers, so the older stored flag does not undo them.
        self.unshared: dict[int, bool] = {}
        # Written by the engine-metrics reader (gateway/fleet/engine.py); None: unknown, routed as idle.
        self.engine: list[EngineLoad | None] = [None] * len(self.urls)
        # When each load stops steering (monotonic clock): a reader that stalled or died leaves no load for good.
        self.engine_until: list[float] = [0.0] * len(self.urls)
        # Why a replica's load is unknown (the status page shows it); None once it is read.
        self.engine_error: list[str | None] = [None] * len(self.urls)
        self.ring = Ring(self.urls, self.weights)
        # Each replica as its state shared through Redis names it: by its URL, not its place in the list.
        self.tags = [replica_tag(url) for url in self.urls]
        # Each replica's identity (`provider@<tag>`): its in-process health and in-flight count are kept under it.
        self.ids = [f"{provider}@{tag}" for tag in self.tags]
        self._current = [0.0] * len(self.urls)  # smooth weighted round robin
        self._turn = 0

    @property
    def size(self) -> int:
        return len(self.urls)

    def side_order(self, cooling: Sequence[bool]) -> list[int]:
        """The replicas a side call (model listing, tokenizer routes) asks in turn until one answers: those
        neither draining nor cooling, then the cooling ones; draining ones only when every replica drains
        (a side call is no new request, and a listing or a tokenization is the same on every replica)."""
        live = [i for i in range(self.size) if not self.draining[i]]
        if not live:
            return list(range(self.size))
        return [i for i in live if not cooling[i]] + [i for i in live if cooling[i]]

    @property
    def stale_s(self) -> float:
        """How long a read load steers: two reads' interval and timeout. A reader reads again well within it,
        so only a stalled or dead one lets a load reach it."""
        r = self.routing
        return 2 * (r.metrics_interval_ms + r.metrics_timeout_ms) / 1000

    def store(self, i: int, load: EngineLoad | None, cause: str | None) -> None:
        """The reader's latest word on replica `i`: its load (None: unknown) or why it has none."""
        self.engine[i] = load
        self.engine_error[i] = cause
        self.engine_until[i] = time.monotonic() + self.stale_s

    def load_of(self, i: int) -> EngineLoad | None:
        """Replica `i`'s load while it is fresh; a stale one is dropped (unknown, routed as idle) and said so."""
        load = self.engine[i]
        if load is not None and self.engine_until[i] <= time.monotonic():
            self.engine[i] = load = None
            self.engine_error[i] = f"no fresh reading for {self.stale_s:.1f} s"
        return load

    def _hot(self, i: int) -> bool:
        load = self.load_of(i)
        return load is not None and load.waiting >= self.routing.max_waiting

    def _load(self, i: int, inflight: Sequence[int]) -> float:
        load = self.load_of(i)
        return inflight[i] + (load.waiting if load is not None else 0.0)

    def choose(self, inflight: Sequence[int], cooling: Sequence[bool], hint: Hint | None) -> list[int]:
        """The replicas to try for one request, best first (draining ones left out)."""
        live = [i for i in range(self.size) if not self.draining[i]]
        if not live:
            return []
        policy = self.routing.policy
        if policy == "prefix" and hint is not None:
            r = self.routing
            owner = hint.owner(self.prefix_scope)
            key = prefix_key(prefix_of(hint.req), r.block_chars, r.block_tokens, r.depth, owner)
            return self._bounded(key, live, inflight, cooling, spread=True)
        if policy == "session" and hint is not None:
            session = session_of(hint.req, hint.headers, self.routing.session_header)
            if session is not None:
                key = session_key(session, hint.owner(self.routing.session_scope))
                return self._bounded(key, live, inflight, cooling, spread=False)
        if policy == "round_robin":
            return self._round_robin(live)
        return self._least(live, inflight, cooling)

    def _least(self, live: list[int], inflight: Sequence[int], cooling: Sequence[bool]) -> list[int]:
        # Ties go round: idle replicas would otherwise all lose to the first one.
        self._turn += 1
        n, turn = self.size, self._turn
        return sorted(live, key=lambda i: (cooling[i], self._hot(i), self._load(i, inflight), (i - turn) % n))

    def _round_robin(self, live: list[int]) -> list[int]:
        total = 0.0
        best = live[0]
        for i in live:
            self._current[i] += self.weights[i]
            total += self.weights[i]
            if self._current[i] > self._current[best]:
                best = i
        self._current[best] -= total
        rest = [i for i in live if i != best]
        first = [best] if not self._hot(best) else []
        return first + [i for i in rest if not self._hot(i)] + [i for i in [best, *rest] if self._hot(i)]

    def _bounded(
        self, key: int, live: list[int], inflight: Sequence[int], cooling: Sequence[bool], *, spread: bool
    ) -> list[int]:
        """Consistent hashing with bounded loads: the first replica clockwise from `key` that is usable and
        under ceil((1 + epsilon) x the mean load, this request counted); with `spread` (prefixes, not sessions),
        the next such replica on the ring instead when it has at least two requests fewer in flight (a hot
        key's traffic stays on two replicas that both cache it, and keys that never recur still spread);
        when none is under the bound, the least loaded."""
        walk = [i for i in self.ring.walk(key) if not self.draining[i]]
        weight = sum(self.weights[i] for i in live)
        total = sum(inflight[i] for i in live) + 1
        eps = self.routing.epsilon

        def fits(i: int) -> bool:
            cap = math.ceil((1 + eps) * total * self.weights[i] / weight)
            return not cooling[i] and not self._hot(i) and inflight[i] < cap

        found = [pos for pos, i in enumerate(walk) if fits(i)][:2]
        if not found:
            return self._least(live, inflight, cooling)
        pos = found[0]
        if spread and len(found) == 2 and inflight[walk[found[0]]] - inflight[walk[found[1]]] >= 2:
            pos = found[1]
        return [walk[pos], *walk[:pos], *walk[pos + 1 :]]


def shared_name(fleets: Mapping[str, Fleet], target: str) -> str:
    """The name a target's health goes by in Redis: a replica's (`provider@i/model`) with `i` replaced by its
    URL's hash, so a reload that reorders or shortens `replicas:`, or a process with another list, never
    reads one replica's cooldown as another's; any other target's own name."""
    provider, at, rest = target.partition("@")
    fleet = fleets.get(provider) if at else None
    index, slash, model = rest.partition("/")
    if fleet is None or not index.isdigit() or int(index) >= fleet.size:
        return target
    return f"{provider}@{fleet.tags[int(index)]}{slash}{model}"
