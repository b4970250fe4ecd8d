"""The value types of a route plan: a `Route` (one upstream target), the `Group`s balanced together, the
`Policy` over them and the `Plan` a request tries in order.

Values only: `gateway.path.routing` builds them from the config; the failover loop, the balancer,
admission and tracing read them from the wings below the request path without importing it.
"""

from __future__ import annotations

import msgspec

from gateway.config import RetriesConfig, Scope, Strategy, TimeoutsConfig
from gateway.fleet.picker import Fleet
from gateway.upstream.transport import Timeouts
from providers.base import Adapter, Endpoint, LocalAdapter
from wire.errors import ProviderUnavailableError


class Route(msgspec.Struct, frozen=True):
    # `provider/model[/deployment]`: the identity health, cooldowns and balancing are keyed on.
    key: str
    provider: str
    adapter: Adapter | LocalAdapter
    endpoint: Endpoint
    drop_unsupported: bool
    # Set when the provider cannot be called (its key variable is unset); requests fail fast with it.
    unavailable: str | None = None
    # Same-target retries of a transient failure (`retries.same_target`: the provider's, else the global).
    same_target: int = 1
    # A provider with `replicas:`: the route stands for them all, and a request is served by one of these
    # (`provider@i/model`, each its own health key), as `fleet` chooses (gateway/fleet).
    replicas: tuple[Route, ...] = ()
    fleet: Fleet | None = None
    # A server or replica whose engine takes a prefix-cache salt, of a provider that keeps tenants' prefixes
    # apart (`prefix_scope` key or team): each attempt sends the salt of the request's tenant
    # (gateway/fleet/tenancy.py).
    salt: Scope | None = None

    def require_available(self) -> None:
        """Refuse at once, naming the missing variable, when the provider cannot be called."""
        if self.unavailable is not None:
            raise ProviderUnavailableError(self.unavailable, param="model", code="provider_unavailable")


class Group(msgspec.Struct, frozen=True):
    """Routes balanced together: an alias's targets, or one fallback."""

    routes: list[Route]
    weights: list[float]
    strategy: Strategy = "weighted"


class Policy(msgspec.Struct, frozen=True):
    retries: RetriesConfig
    timeouts: TimeoutsConfig
    resume_streams: bool = False
    hedge_after_ms: int | None = None
    # An alias's own `retries.same_target`, which wins over each target's provider value.
    same_target: int | None = None


class Plan(msgspec.Struct):
    """Everything a request may try, in order: the targets, then each fallback."""

    groups: list[Group]
    policy: Policy
    context_groups: list[Group] = msgspec.field(default_factory=list)
    # Derived once from the groups, never per request: every target the plan may touch (health is read
    # for all of them), and whether its strategies need in-flight counts or latencies recorded.
    keys: tuple[str, ...] = ()
    tracks_inflight: bool = False
    tracks_latency: bool = False
    timeouts: Timeouts = Timeouts(0.0, 0.0, 0.0)  # the policy's, in seconds (set below)
    # The one route of a direct `vendor/model` request (no alias, no fallbacks), else None (set below): read on
    # every request by the limits and the queue.
    single: Route | None = None
    # The order a request tries the groups' routes in, when nothing per request changes it (every group one
    # route or `ordered`, no replicated provider): the balancer's `candidates`, made once here. Else None.
    fixed_order: tuple[Route, ...] | None = None

    def __post_init__(self) -> None:
        self.timeouts = Timeouts.of(self.policy.timeouts)
        groups = self.groups + self.context_groups
        seen: dict[str, None] = {}
        fleets = False
        for g in groups:
            for r in g.routes:
                seen.setdefault(r.key, None)
                for replica in r.replicas:
                    seen.setdefault(replica.key, None)
                    fleets = True
        self.keys = tuple(seen)
        self.tracks_inflight = fleets or any(g.strategy == "least-busy" for g in groups)
        self.tracks_latency = any(g.strategy == "latency" for g in self.groups)
        if len(self.groups) == 1 and len(self.groups[0].routes) == 1 and not self.context_groups:
            self.single = self.groups[0].routes[0]
        routes = [r for g in self.groups for r in g.routes]
        if all(len(g.routes) == 1 or g.strategy == "ordered" for g in self.groups) and all(
            r.fleet is None for r in routes
        ):
            first: dict[str, Route] = {}
            for r in routes:
                first.setdefault(r.key, r)  # a target named twice is tried once, where it first comes
            self.fixed_order = tuple(first.values())
