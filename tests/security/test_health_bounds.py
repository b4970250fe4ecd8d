"""Target health a process keeps is bounded: direct `vendor/model` targets are named by clients.

Before the fix, every invented model name sent to a failing provider left entries in the in-process
cooldown, failure, in-flight and latency maps that were never removed. Real `Health` over in-process state
(no Redis configured), driven as the failover loop drives it.
"""

from __future__ import annotations

from gateway.config import CooldownConfig
from gateway.resilience.evidence import MAX_OUTCOMES, MAX_WATCHED, Evidence
from gateway.resilience.health import Health
from gateway.resilience.local import MAX_TARGETS
from gateway.state import SharedState


async def test_invented_targets_do_not_grow_the_health_maps_without_bound() -> None:
    health = Health(SharedState(""), CooldownConfig())
    await health.failure("real/model", None, "error")
    for i in range(MAX_TARGETS + 2_000):
        target = f"flaky/invented-{i}"
        await health.inflight(target, 1)
        await health.failure(target, None, "error")
        await health.latency(target, 12.0)
        await health.inflight(target, -1)
        if i % 1_000 == 0:
            await health.failure("real/model", None, "error")  # still failing: kept among the newest
    local = health.local
    for name in ("cool", "failures", "probes", "inflight", "latency"):
        assert len(getattr(local, name)) <= MAX_TARGETS, name
    assert local.inflight == {}  # a count back at zero keeps no entry
    state = (await health.snapshot(["real/model"]))["real/model"]
    assert state.cooling_ms > 0 and state.failures > 1


def test_invented_targets_and_floods_do_not_grow_the_evidence_window_without_bound() -> None:
    now = [0.0]
    evidence = Evidence(CooldownConfig(min_requests=10**6), lambda: now[0])  # never decides: all is kept
    for i in range(MAX_WATCHED + 2_000):
        target = f"flaky/invented-{i}"
        evidence.failure(target, "red")
        evidence.success(target, "blue")
    assert len(evidence.watched) <= MAX_WATCHED and len(evidence.served) <= MAX_WATCHED
    for _ in range(MAX_OUTCOMES * 3):  # one target, one window, a flood of failures
        evidence.failure("flaky/one", "red")
    assert len(evidence.watched["flaky/one"]) == MAX_OUTCOMES
