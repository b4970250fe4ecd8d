"""Cooldowns, recovery probes and the all-targets-cooling answer (docs/resilience.md, "Cooldowns").

Virtual time drives the in-process state, so cooldown lengths are asserted to the millisecond; the
Redis-backed tests use a real redis-server (TTL in real time, asserted with a tolerance).
"""

from __future__ import annotations

import asyncio

import pytest

from gateway.resilience.health import TargetState
from tests.helpers.faults import FaultServer, good, rate_limited, slow, unavailable
from tests.helpers.pipelines import VirtualTime, ask, key, state
from tests.helpers.redis import RedisServer
from wire.errors import AllTargetsCoolingError

from .conftest import MakePipeline, Reference

ONLY_A = """
  - name: smart
    targets: [{model: alpha/davinci-002}]
"""
ORDERED_AB = """
  - name: smart
    strategy: ordered
    targets: [{model: alpha/davinci-002}, {model: beta/davinci-002}]
"""
COOLDOWN = "cooldown: {base_ms: 1000, max_ms: 5000, min_requests: 1}\n"
# These tests watch cooldowns as a request fails over; retrying the same target first (the default,
# tests/resilience/test_same_target_*.py) would hide that, so they fail over at once.
AT_ONCE = ", same_target: 0"


def one_attempt(cooldown: str = COOLDOWN) -> str:
    return "retries: {attempts: 1}\n" + cooldown


async def test_cooldown_doubles_per_failure_up_to_max_and_a_probe_success_clears_it(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime
) -> None:
    faults["alpha"].script(unavailable(), unavailable(), unavailable(), unavailable())
    p = make(ONLY_A, top=one_attempt())
    expected = [1000, 2000, 4000, 5000]  # base_ms doubling per consecutive failure, capped at max_ms
    for i, ms in enumerate(expected):
        answer = await ask(p)
        assert answer.error is not None and answer.error.status == 502
        assert await state(p, "alpha") == TargetState(cooling_ms=ms, cause="error", failures=i + 1)
        # While it cools, nobody calls it: the answer is 503 with the time left.
        vtime.advance(ms / 1000 - 0.25)
        cooling = await ask(p)
        assert isinstance(cooling.error, AllTargetsCoolingError)
        assert (cooling.error.status, cooling.error.retry_after) == (503, 0.25)
        vtime.advance(0.25)
        assert faults["alpha"].count == i + 1
    # The cooldown is over: the next request is the probe, and it succeeds.
    answer = await ask(p)
    assert answer.served_by == key("alpha")
    assert faults["alpha"].count == 5
    assert await state(p, "alpha") == TargetState()
    # After a success the count starts again from base_ms.
    faults["alpha"].script(unavailable())
    await ask(p)
    assert await state(p, "alpha") == TargetState(cooling_ms=1000, cause="error", failures=1)


async def test_retry_after_sets_the_cooldown(make: MakePipeline, faults: FaultServer, vtime: VirtualTime) -> None:
    faults["alpha"].script(rate_limited(retry_after="3"))
    p = make(ONLY_A, top=one_attempt())
    await ask(p)
    assert await state(p, "alpha") == TargetState(cooling_ms=3000, cause="429", failures=1)


async def test_all_targets_rate_limited_answers_429_with_the_soonest_recovery(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime
) -> None:
    faults["alpha"].script(rate_limited(retry_after="5"))
    faults["beta"].script(rate_limited(retry_after="3"))
    p = make(ORDERED_AB, top="retries: {attempts: 2" + AT_ONCE + "}\n" + COOLDOWN)
    first = await ask(p)
    assert first.error is not None and first.error.status == 429 and first.attempts == 2
    assert vtime.sleeps == [0.0]
    vtime.advance(1.0)
    answer = await ask(p)
    assert faults.order() == ["alpha", "beta"]  # nobody was called for the second request
    assert isinstance(answer.error, AllTargetsCoolingError)
    assert (answer.error.status, answer.error.retry_after) == (429, 2.0)
    assert answer.attempts == 0
    assert answer.error_body() == {
        "error": {
            "message": "Every target for this model is cooling down after failures; retry later",
            "type": "rate_limit_error",
            "param": None,
            "code": "all_targets_cooling",
        }
    }


async def test_targets_cooled_by_errors_answer_503(make: MakePipeline, faults: FaultServer, vtime: VirtualTime) -> None:
    faults["alpha"].script(rate_limited(retry_after="5"))
    faults["beta"].script(unavailable(retry_after="4"))
    p = make(ORDERED_AB, top="retries: {attempts: 2" + AT_ONCE + "}\n" + COOLDOWN)
    await ask(p)
    answer = await ask(p)
    assert faults.order() == ["alpha", "beta"]
    assert isinstance(answer.error, AllTargetsCoolingError)
    assert (answer.error.status, answer.error.type, answer.error.retry_after) == (503, "service_unavailable", 4.0)


async def test_a_cooling_target_is_skipped_until_its_cooldown_ends(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime, reference: Reference
) -> None:
    faults["alpha"].script(unavailable(retry_after="2"))
    p = make(ORDERED_AB, top="retries: {attempts: 3" + AT_ONCE + "}\n" + COOLDOWN)
    first = await ask(p)
    assert first.served_by == key("beta")
    for _ in range(3):
        answer = await ask(p)
        assert answer.served_by == key("beta") and answer.attempts == 1
    vtime.advance(2.0)
    answer = await ask(p)  # alpha recovered: it is first in order again (and this request is its probe)
    assert answer.served_by == key("alpha") and answer.attempts == 1
    assert faults.order() == ["alpha", "beta", "beta", "beta", "beta", "alpha"]
    assert await state(p, "alpha") == TargetState()


async def test_only_one_request_probes_a_recovering_target(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime
) -> None:
    faults["alpha"].script(unavailable(), then=slow(0.3))
    p = make(ONLY_A, top="retries: {attempts: 1}\ntimeouts: {first_byte_ms: 4000}\n" + COOLDOWN)
    await ask(p)
    vtime.advance(1.0)
    assert await state(p, "alpha") == TargetState(cooling_ms=0, cause=None, failures=1)
    answers = await asyncio.gather(*(ask(p) for _ in range(3)))
    assert faults["alpha"].count == 2  # the failure, then exactly one probe
    served = [a for a in answers if a.error is None]
    refused = [a.error for a in answers if a.error is not None]
    assert len(served) == 1 and served[0].served_by == key("alpha")
    assert len(refused) == 2
    for err in refused:
        assert isinstance(err, AllTargetsCoolingError)
        # Nothing is cooling any more: the target is being probed, not rate limited. The probe slot is
        # held for first_byte_ms, the soonest another request may become the probe.
        assert (err.status, err.retry_after, err.attempts) == (503, 4.0, 0)
    # The probe succeeded: everyone may use the target again.
    assert await state(p, "alpha") == TargetState()
    faults["alpha"].script(then=good())
    answers = await asyncio.gather(*(ask(p) for _ in range(3)))
    assert [a.served_by for a in answers] == [key("alpha")] * 3


async def test_a_failed_probe_starts_a_longer_cooldown(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime
) -> None:
    faults["alpha"].script(unavailable(), unavailable())
    p = make(ORDERED_AB, top="retries: {attempts: 2" + AT_ONCE + "}\n" + COOLDOWN)
    # Request 1: alpha fails (cooled 1 s), beta serves.
    assert (await ask(p)).served_by == key("beta")
    vtime.advance(1.0)
    # Request 2 probes alpha, which fails again: 2 s now; beta serves without a wait.
    answer = await ask(p)
    assert answer.served_by == key("beta") and answer.attempts == 2
    assert vtime.sleeps == [0.0, 0.0]
    assert await state(p, "alpha") == TargetState(cooling_ms=2000, cause="error", failures=2)
    assert faults.order() == ["alpha", "beta", "alpha", "beta"]


async def test_a_request_that_recovers_its_own_target_clears_the_cooldown(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime
) -> None:
    """'The request that caused a cooldown may still retry that target after its wait: its retry is the probe.'"""
    faults["alpha"].script(unavailable())
    p = make(ONLY_A, top="retries: {attempts: 2}\n" + COOLDOWN)
    first = await ask(p)
    assert first.served_by == key("alpha") and first.attempts == 2
    assert len(vtime.sleeps) == 1 and 0 <= vtime.sleeps[0] <= 0.25  # backoff, shorter than the 1 s cooldown
    # The probe succeeded: the failure count is cleared and the target is usable at once.
    assert await state(p, "alpha") == TargetState()
    second = await ask(p)
    assert second.served_by == key("alpha") and second.attempts == 1
    assert faults["alpha"].count == 3


# --------------------------------------------------------------------------------------------------
# Shared through Redis (two pipelines in one process here; two processes in test_processes.py)


async def test_replicas_share_cooldowns_and_the_probe_through_redis(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime, redis: RedisServer
) -> None:
    # refresh_ms 0: every snapshot reads Redis, so the replicas' views are exactly Redis's.
    top = (
        f"redis: {{url: '{redis.url}', refresh_ms: 0}}\nretries: {{attempts: 2{AT_ONCE}}}\n"
        "cooldown: {base_ms: 300, max_ms: 5000, min_requests: 1}\n"
    )
    one, two = make(ORDERED_AB, top=top), make(ORDERED_AB, top=top)
    faults["alpha"].script(unavailable())
    assert (await ask(one)).served_by == key("beta")
    assert faults.order() == ["alpha", "beta"]
    # The other replica skips alpha: it learnt of the cooldown from Redis.
    cooled = await state(two, "alpha")
    assert 0 < cooled.cooling_ms <= 300 and (cooled.cause, cooled.failures) == ("error", 1)
    answer = await ask(two)
    assert answer.served_by == key("beta") and answer.attempts == 1
    assert faults.order() == ["alpha", "beta", "beta"]
    # After the cooldown (real time: Redis TTLs), exactly one replica gets the probe.
    await asyncio.sleep(0.35)
    faults["alpha"].script(then=slow(0.3))
    answers = await asyncio.gather(ask(one), ask(two))
    assert sorted(a.served_by for a in answers) == [key("alpha"), key("beta")]
    assert faults["alpha"].count == 2
    assert await state(one, "alpha") == await state(two, "alpha") == TargetState()
    assert not one.shared.degraded and not two.shared.degraded


async def test_a_replica_reads_shared_health_again_after_refresh_ms(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime, redis: RedisServer
) -> None:
    top = f"redis: {{url: '{redis.url}', refresh_ms: 250}}\nretries: {{attempts: 2}}\n" + COOLDOWN
    one, two, three = (make(ORDERED_AB, top=top) for _ in range(3))
    for replica in (two, three):
        assert (await ask(replica)).served_by == key("alpha")  # each now holds a copy: alpha healthy
    faults["alpha"].script(then=unavailable(retry_after="30"))
    assert (await ask(one)).served_by == key("beta")  # one cools alpha in Redis for 30 s
    assert faults.order() == ["alpha", "alpha", "alpha", "beta"]
    # 0.2 s later two's copy is still fresh: it calls alpha (and fails over). Staleness is bounded...
    vtime.advance(0.2)
    stale = await ask(two)
    assert (stale.served_by, stale.attempts) == (key("beta"), 2)
    assert faults.order()[4:] == ["alpha", "beta"]
    # ...by refresh_ms: at 0.3 s three's copy has expired, it reads Redis and goes straight to beta.
    vtime.advance(0.1)
    fresh = await ask(three)
    assert (fresh.served_by, fresh.attempts) == (key("beta"), 1)
    assert faults.order()[6:] == ["beta"]


async def test_copies_near_refresh_ms_are_renewed_ahead_without_a_request_waiting(
    make: MakePipeline, vtime: VirtualTime, redis: RedisServer
) -> None:
    import redis as redis_py

    top = f"redis: {{url: '{redis.url}', refresh_ms: 250}}\n" + COOLDOWN
    one, two = make(ORDERED_AB, top=top), make(ORDERED_AB, top=top)
    targets = [key("alpha"), key("beta")]
    counter = redis_py.Redis(port=redis.port)

    def reads() -> int:
        # One PTTL per target per read of the shared health.
        return int(counter.info("commandstats").get("cmdstat_pttl", {}).get("calls", 0))

    assert (await two.health.snapshot(targets))[key("alpha")] == TargetState()  # two's copies, read at 0 s
    await one.health.failure(key("alpha"), 30.0, "error")  # another replica cools alpha in Redis
    counter.config_resetstat()
    # At 0.1 s the copies are fresh: nothing is read.
    vtime.advance(0.1)
    assert (await two.health.snapshot(targets))[key("alpha")] == TargetState()
    assert reads() == 0
    # At 0.2 s (past three quarters of refresh_ms) the request is answered from the copies at once, still
    # younger than refresh_ms, and their read starts in the background...
    vtime.advance(0.1)
    assert (await two.health.snapshot(targets))[key("alpha")] == TargetState()
    for _ in range(200):
        if reads() == 2:
            break
        await asyncio.sleep(0.01)
    assert reads() == 2
    # ...so the next request, still before refresh_ms, sees alpha cooling without waiting for a read of its own.
    await asyncio.sleep(0.05)  # the read's answer stored as the copies
    seen = (await two.health.snapshot(targets))[key("alpha")]
    assert seen.cooling_ms > 29_000 and seen.cause == "error"
    assert reads() == 2
    counter.close()


async def test_a_request_out_of_attempts_does_not_take_the_next_targets_probe(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime, reference: Reference
) -> None:
    p = make(ORDERED_AB, top="retries: {attempts: 1}\ntimeouts: {first_byte_ms: 30000}\n" + COOLDOWN)
    await p.health.failure(key("beta"), 1.0, "error")
    vtime.advance(1.0)  # beta is recovering: the next request to pick it is its probe
    faults["alpha"].script(unavailable(retry_after="10"))
    first = await ask(p)
    assert first.error is not None and first.attempts == 1
    # That request had no attempt left for beta, so it must not have claimed beta's probe slot
    # (held for first_byte_ms, 30 s): the next request is the probe, and beta serves it.
    second = await ask(p)
    assert second.served_by == key("beta") and second.attempts == 1
    assert faults.order() == ["alpha", "beta"]
    assert await state(p, "beta") == TargetState()


async def test_requests_arriving_while_shared_health_is_read_share_one_read(
    make: MakePipeline, vtime: VirtualTime, redis: RedisServer
) -> None:
    import redis as redis_py

    top = f"redis: {{url: '{redis.url}', refresh_ms: 250}}\n" + COOLDOWN
    replica = make(ORDERED_AB, top=top)
    targets = [key("alpha"), key("beta")]
    counter = redis_py.Redis(port=redis.port)
    counter.config_resetstat()

    def reads() -> int:
        # One PTTL per target per read of the shared health (gateway/resilience/health.py).
        return int(counter.info("commandstats").get("cmdstat_pttl", {}).get("calls", 0))

    # Twenty requests find the copies stale at once: one read answers them all, each with a view of its own
    # (the states in it are shared, and frozen: a request changes its view, never a state another one reads).
    views = await asyncio.gather(*(replica.health.snapshot(targets) for _ in range(20)))
    assert reads() == 2
    assert all(view == views[0] for view in views) and views[0] is not views[1]
    views[2][key("alpha")] = TargetState(cooling_ms=5)
    assert views[1][key("alpha")] == TargetState()
    with pytest.raises(AttributeError):
        views[1][key("alpha")].cooling_ms = 5  # type: ignore[misc]
    # A change this replica makes is never answered from a read that started before it.
    vtime.advance(0.3)
    pending = asyncio.ensure_future(replica.health.snapshot(targets))
    await asyncio.sleep(0)
    replica.health.forget(key("alpha"))
    after = await replica.health.snapshot(targets)
    await pending
    assert reads() == 6
    assert after == views[0]
    counter.close()
