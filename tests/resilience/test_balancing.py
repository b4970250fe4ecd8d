"""Which target serves: ordered, least-busy, latency and weighted strategies (docs/resilience.md, "Balancing")."""

from __future__ import annotations

import asyncio
import random
from collections import Counter

import pytest

from gateway.resilience.balancer import order
from gateway.resilience.health import TargetState
from gateway.upstream.plan import Group
from tests.helpers.faults import FaultServer, good, slow, unavailable
from tests.helpers.pipelines import VirtualTime, ask, key

from .conftest import SEED, MakePipeline


def alias(strategy: str, *targets: str, weights: tuple[float, ...] | None = None) -> str:
    ws = weights or tuple(1.0 for _ in targets)
    listed = ", ".join(f"{{model: {t}/davinci-002, weight: {w}}}" for t, w in zip(targets, ws, strict=True))
    return f"  - name: smart\n    strategy: {strategy}\n    targets: [{listed}]\n"


async def test_ordered_takes_the_first_healthy_target(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime
) -> None:
    p = make(alias("ordered", "alpha", "beta", "gamma"))
    for _ in range(3):
        assert (await ask(p)).served_by == key("alpha")
    await p.health.failure(key("alpha"), 10.0, "error")
    for _ in range(2):
        assert (await ask(p)).served_by == key("beta")
    await p.health.failure(key("beta"), 5.0, "429")
    assert (await ask(p)).served_by == key("gamma")
    vtime.advance(5.0)  # beta recovers first: it is ahead of gamma again
    assert (await ask(p)).served_by == key("beta")
    assert faults.order() == ["alpha"] * 3 + ["beta"] * 2 + ["gamma", "beta"]
    assert vtime.sleeps == []


async def test_least_busy_goes_where_fewest_requests_are_in_flight(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime
) -> None:
    p = make(alias("least-busy", "alpha", "beta", "gamma"))
    # Idle: ties keep config order.
    assert (await ask(p)).served_by == key("alpha")
    # Real in-flight requests: alpha holds one, so the next goes to beta, then gamma.
    faults["alpha"].script(slow(0.5))
    faults["beta"].script(slow(0.5))
    busy_a = asyncio.ensure_future(ask(p))
    while faults["alpha"].count < 2:
        await asyncio.sleep(0.005)
    busy_b = asyncio.ensure_future(ask(p))
    while faults["beta"].count < 1:
        await asyncio.sleep(0.005)
    assert await p.health.snapshot([key("alpha"), key("beta"), key("gamma")]) == {
        key("alpha"): TargetState(inflight=1),
        key("beta"): TargetState(inflight=1),
        key("gamma"): TargetState(inflight=0),
    }
    assert (await ask(p)).served_by == key("gamma")
    assert [(await busy_a).served_by, (await busy_b).served_by] == [key("alpha"), key("beta")]
    # Everything finished: the counts are back to zero and alpha is first again.
    snap = await p.health.snapshot([key("alpha"), key("beta"), key("gamma")])
    assert [s.inflight for s in snap.values()] == [0, 0, 0]
    assert (await ask(p)).served_by == key("alpha")
    # Counts set through the Health API order the targets the same way.
    await p.health.inflight(key("alpha"), +2)
    await p.health.inflight(key("beta"), +1)
    await p.health.inflight(key("gamma"), +3)
    assert (await ask(p)).served_by == key("beta")
    assert faults.order() == ["alpha", "alpha", "beta", "gamma", "alpha", "beta"]


async def test_latency_prefers_unmeasured_then_the_fastest_ewma(make: MakePipeline, faults: FaultServer) -> None:
    wall = VirtualTime(follow_wall=True)  # latency is measured on the injected clock: let it run
    p = make(alias("latency", "alpha", "beta"), time=wall)
    faults["alpha"].script(then=slow(0.15))
    served = [(await ask(p)).served_by for _ in range(4)]
    # alpha first (both unmeasured, config order), then beta (unmeasured), then the faster: beta.
    assert served == [key("alpha"), key("beta"), key("beta"), key("beta")]
    lat = p.health.local.latency  # kept by each target's identity (the server it calls)
    assert lat[p.health.named(key("alpha"))] >= 150 and lat[p.health.named(key("beta"))] < 100
    # beta slows down: its EWMA (alpha = 0.3) climbs past alpha's 150 ms after two slow answers.
    faults["beta"].script(slow(0.4), slow(0.4))
    served = [(await ask(p)).served_by for _ in range(3)]
    assert served == [key("beta"), key("beta"), key("alpha")]


async def test_latency_ewma_is_exact(make: MakePipeline) -> None:
    p = make(alias("latency", "alpha", "beta"))
    for ms in (100.0, 200.0, 50.0):
        await p.health.latency(key("alpha"), ms)
    # 100 -> 0.3*200 + 0.7*100 = 130 -> 0.3*50 + 0.7*130 = 106
    snap = await p.health.snapshot([key("alpha"), key("beta")])
    assert snap[key("alpha")].latency_ms == pytest.approx(106.0, abs=1e-9)
    assert snap[key("beta")].latency_ms is None


async def test_weighted_first_picks_follow_the_weights(make: MakePipeline, faults: FaultServer) -> None:
    p = make(alias("weighted", "alpha", "beta", weights=(3.0, 1.0)))
    n = 240
    served = [(await ask(p)).served_by for _ in range(n)]
    share = Counter(served)[key("alpha")]
    # Binomial(240, 0.75): mean 180, sd 6.7; five sd either way.
    assert 146 <= share <= 214, share
    assert set(served) == {key("alpha"), key("beta")}
    # The draw is random.random: the same seed gives the same sequence of targets.
    random.seed(SEED)
    again = [(await ask(p)).served_by for _ in range(n)]
    assert again == served


async def test_weighted_order_is_a_weighted_draw_without_replacement(make: MakePipeline) -> None:
    p = make(alias("weighted", "alpha", "beta", "gamma", weights=(6.0, 3.0, 1.0)))
    group: Group = p.router.plan("smart").groups[0]
    states = {r.key: TargetState() for r in group.routes}
    rng = random.Random(SEED)
    draws = 20_000
    firsts: Counter[str] = Counter()
    for _ in range(draws):
        routes = order(group, states, rng.random)
        assert sorted(r.key for r in routes) == sorted(states)  # every target, once
        firsts[routes[0].key] += 1
    for target, weight in (("alpha", 0.6), ("beta", 0.3), ("gamma", 0.1)):
        share = firsts[key(target)] / draws
        assert abs(share - weight) < 0.02, (target, share)  # > 5 sd at this many draws


async def test_weighted_failover_goes_to_another_target_at_once(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime
) -> None:
    # same_target 0: the failover itself is the subject (the default retries alpha once first).
    p = make(alias("weighted", "alpha", "beta", weights=(1000.0, 0.001)), top="retries: {same_target: 0}\n")
    faults["alpha"].script(unavailable(), then=good())
    answer = await ask(p)
    assert faults.order() == ["alpha", "beta"]
    assert vtime.sleeps == [0.0]
    assert answer.served_by == key("beta")
