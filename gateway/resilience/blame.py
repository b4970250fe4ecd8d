"""What a failed upstream attempt says about its target, and reporting it to health.

A failure blames its target (a cooldown at once, or evidence for the window) or the request itself
(nothing is reported); the rules are docs/resilience.md "Cooldowns". The failover loop
(gateway/resilience/failover.py) asks these for each failed attempt and each stream that broke.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from gateway.resilience.health import Health, TargetState
from gateway.upstream.plan import Plan
from wire.errors import GatewayError, UpstreamConnectError


def blame(exc: GatewayError, *, client_headers: bool) -> tuple[str, bool] | None:
    """What a failure says about its target: None when it says nothing (the request's own doing), else
    the cooldown's cause and whether it cools at once (True) or only with the window's evidence (False).

    At once: the target could not be reached or dropped the connection, rate-limited or refused the
    gateway's own credential. A client's forwarded headers (`inference_extra_headers`, an
    `OpenAI-Organization` of another org) may be what the upstream refused, so with them a 401, 403 or
    429 blames the request. A 5xx or a timeout may be the request's input: evidence, not a verdict.
    """
    if not exc.cools:
        return None
    if exc.quota or exc.elsewhere or getattr(exc, "upstream_status", None) == 429:
        if client_headers:
            return None
        # Neither an exhausted quota nor refused credentials come back within a retry: keep everyone off.
        return ("quota" if exc.quota or exc.elsewhere else "429"), True
    if not exc.retryable:
        return None
    if isinstance(exc, UpstreamConnectError) or exc.cause == "connect_timeout":
        return "error", True
    return "error", False


def own_deadline(plan: Plan, deadline_s: float | None) -> bool:
    """Whether the request's own deadline is shorter than its plan's `total_ms`: its timeouts may be its own."""
    return deadline_s is not None and deadline_s < plan.timeouts.total


async def charge(
    health: Health, key: str, tenant: str | None, exc: GatewayError, blame: tuple[str, bool], *, failing: bool
) -> bool:
    """One request's failure that blames target `key` (`blame`): it cools the target at once, or only with
    the window's evidence (`failing`: the target was failing already, this request its probe, and needs
    none). Whether it was cooled."""
    cause, at_once = blame
    evidence, named = health.evidence, health.named(key)  # the evidence goes by the target's identity
    if at_once:
        evidence.suspects.pop(named, None)  # the target's own failure: nobody's input is suspected
    elif not failing:
        if not evidence.failure(named, tenant):
            return False
    else:
        # A target already failing (a probe of it, after a cooldown) needs no more evidence; this key has
        # now seen it fail too, and probes it no more during the cooldown.
        keys = evidence.suspects.get(named)
        if keys is not None:
            keys.add(tenant)
    await health.failure(key, exc.retry_after, cause)
    return True


def cleared_for(
    tenant: str, states: dict[str, TargetState], suspects: dict[str, set[str | None]], named: Callable[[str], str]
) -> None:
    """A target cooled on other keys' failures alone is recovering, not cooling, for this key: it may
    claim the probe (its success ends the cooldown for everyone; its failure makes it a suspect too).
    `suspects` go by identity (`named`)."""
    for target, st in states.items():
        keys = suspects.get(named(target))
        if keys is not None and tenant not in keys and st.cooling_ms > 0 and st.cause == "error":
            states[target] = msgspec.structs.replace(st, cooling_ms=0, cause=None, failures=max(st.failures, 1))
