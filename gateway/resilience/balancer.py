"""Choosing which target serves each attempt of a request.

Strategies (`weighted`, `ordered`, `least-busy`, `latency`) order one group's routes; groups are the
alias's targets, then each fallback. A `Selector` walks that order for one request, skipping cooling
targets. The strategies and the selector's rules: docs/resilience.md.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from gateway.fleet.picker import Hint
from gateway.resilience.health import Health, TargetState
from gateway.upstream.plan import Group, Plan, Route
from wire.errors import AllTargetsCoolingError, GatewayError


def order(group: Group, states: dict[str, TargetState], rng: Callable[[], float] = random.random) -> list[Route]:
    routes = group.routes
    if len(routes) == 1 or group.strategy == "ordered":
        return list(routes)
    if group.strategy == "weighted":
        # Efraimidis-Spirakis: sorting by u^(1/w) draws a weighted order without replacement.
        keyed = sorted(((rng() ** (1.0 / w), i) for i, w in enumerate(group.weights)), reverse=True)
        return [routes[i] for _, i in keyed]
    if group.strategy == "least-busy":
        return sorted(routes, key=lambda r: busy(r, states))
    return sorted(routes, key=lambda r: (states[r.key].latency_ms is not None, states[r.key].latency_ms or 0.0))


def busy(route: Route, states: dict[str, TargetState]) -> int:
    """A route's requests in flight; a replicated provider's are counted on its replicas, so they are summed."""
    if route.replicas:
        return sum(states[r.key].inflight for r in route.replicas)
    return states[route.key].inflight


def candidates(
    groups: list[Group],
    states: dict[str, TargetState],
    hint: Hint | None = None,
    inflight: dict[str, int] | None = None,
) -> list[Route]:
    seen: set[str] = set()
    out: list[Route] = []
    for g in groups:
        for r in order(g, states):
            for x in replicas(r, states, hint, inflight) if r.fleet is not None else (r,):
                if x.key not in seen:
                    seen.add(x.key)
                    out.append(x)
    return out


def replicas(
    route: Route, states: dict[str, TargetState], hint: Hint | None, inflight: dict[str, int] | None
) -> list[Route]:
    """A replicated provider's route as its replicas, in the order its fleet's policy chose (gateway/fleet).
    `inflight`: each replica's requests in flight over all its models (`Health`'s `replica_inflight`, by identity)."""
    assert route.fleet is not None
    counts = inflight if inflight is not None else {}
    loads, cooling = [], []
    for r, identity in zip(route.replicas, route.fleet.ids, strict=True):
        loads.append(counts.get(identity, 0))
        cooling.append(states[r.key].cooling_ms > 0)
    chosen = route.fleet.choose(loads, cooling, hint)
    return [route.replicas[i] for i in chosen]


class Selector:
    def __init__(
        self, plan: Plan, states: dict[str, TargetState], health: Health, probe_ttl_ms: int, hint: Hint | None = None
    ) -> None:
        self.plan = plan
        self.states = states
        self.health = health
        self.probe_ttl_ms = probe_ttl_ms
        self.hint = hint
        fixed = plan.fixed_order
        self.order: Sequence[Route] = (
            fixed if fixed is not None else candidates(plan.groups, states, hint, health.local.replica_inflight)
        )
        self.tried: list[Route] = []
        self.context_switched = False

    async def _fresh(self) -> Route | None:
        """The first route in order not tried yet that may be called: configured, not cooling, and when
        recovering (not cooling, failed before) only once its probe is claimed."""
        tried = {r.key for r in self.tried} if self.tried else ()
        states = self.states
        for route in self.order:
            if route.unavailable is not None or route.key in tried:
                continue
            state = states[route.key]
            if state.cooling_ms > 0:
                continue
            if state.failures > 0 and not await self.health.probe(route.key, self.probe_ttl_ms):
                continue  # recovering, and another request has its probe
            return route
        return None

    async def first(self) -> Route:
        route = await self._fresh()
        if route is None:
            if not self.order:
                # Every replica of every target is draining: nothing may take a new request.
                raise GatewayError(
                    "Every replica serving this model is draining; retry later",
                    code="replicas_draining",
                    status=503,
                    type="service_unavailable",
                    retry_after=1.0,
                    retry_later=True,
                )
            if all(r.unavailable is not None for r in self.order):
                # Nothing cooling, just nothing configured to call: say which variable is missing.
                self.order[0].require_available()
            raise self._all_cooling()
        self.tried.append(route)
        return route

    def first_now(self) -> Route | None:
        """`first`'s common case without a coroutine: the first route in order, when it may be called and
        needs no probe claimed. None: `first` decides (a probe to claim, or nothing to call)."""
        states = self.states
        for route in self.order:
            if route.unavailable is not None:
                continue
            state = states[route.key]
            if state.cooling_ms > 0:
                continue
            if state.failures > 0:
                return None
            self.tried.append(route)
            return route
        return None

    def has_untried(self) -> bool:
        """Whether a target not yet tried could still be called (cooling and unavailable ones cannot)."""
        tried = {r.key for r in self.tried}
        return any(
            r.key not in tried and r.unavailable is None and self.states[r.key].cooling_ms <= 0 for r in self.order
        )

    async def next(self) -> tuple[Route, bool]:
        """The next route to try and whether it is a new target (no wait needed)."""
        route = await self._fresh()
        if route is not None:
            self.tried.append(route)
            return route, True
        return self.tried[-1], False

    def switch_to_context_fallbacks(self) -> bool:
        """After a context-window error only the larger-context fallbacks can help."""
        if self.context_switched or not self.plan.context_groups:
            return False
        self.context_switched = True
        self.order = candidates(self.plan.context_groups, self.states, self.hint, self.health.local.replica_inflight)
        return True

    def _all_cooling(self) -> AllTargetsCoolingError:
        states = [self.states[r.key] for r in self.order if r.unavailable is None]
        cooling = [s for s in states if s.cooling_ms > 0]
        waits = [s.cooling_ms for s in cooling] or [self.probe_ttl_ms]
        # Only targets cooled by rate limits make it a 429; a target being probed is not rate limited.
        rate_limited = bool(cooling) and all(s.cause == "429" for s in cooling)
        return AllTargetsCoolingError(
            "Every target for this model is cooling down after failures; retry later",
            rate_limited=rate_limited,
            retry_after=min(waits) / 1000,
        )
