"""Calls queued in one event-loop tick go to Redis as one script call, each decided as if it ran alone.

A gateway under load has many requests' admissions (and settles) ready at once; the channel sends
them as one EVALSHA of the script's `batch` mode, which decides them in order on one clock and answers
each on its own. What must hold: limits stay exact across gateways sharing Redis, a refusal answers
only its own request, a call that Redis has to be told the script again for is still answered, and a
Cluster (every key in the `{rl}` slot) takes merged calls like single ones.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest

from gateway.limits.ratelimit import Bucket, Limiter
from gateway.limits.scriptchannel import PARTS_PER_CALL
from gateway.state import SharedState
from tests.helpers.redis import RedisServer


def scope() -> str:
    return "key:merged-" + uuid.uuid4().hex[:12]


def evalsha_calls(rds: RedisServer) -> int:
    with rds.client() as r:
        stats = r.info("commandstats").get("cmdstat_evalsha", {})
    return int(stats.get("calls", 0))


async def test_two_gateways_sharing_redis_stay_exact_under_concurrent_load(rds: RedisServer) -> None:
    """Two limiters (two gateways: each its own channel) fire 150 admissions at once on one rpm 50 and
    one tpm 5000 bucket: exactly 50 are admitted across both, though every tick merges dozens of them."""
    rpm, tpm = Bucket(scope(), "rpm", 50), Bucket(scope(), "tpm", 5000)
    shares = [SharedState(rds.url), SharedState(rds.url)]
    limiters = [Limiter(s, fail_open=False) for s in shares]
    try:
        for lim in limiters:  # connected, the script loaded: what follows is the steady state
            assert (await lim.acquire([Bucket(scope(), "rpm", 10)], 0)).allowed
        before = evalsha_calls(rds)
        decisions = await asyncio.gather(*(limiters[i % 2].acquire([rpm, tpm], 100) for i in range(150)))
        calls = evalsha_calls(rds) - before
    finally:
        for lim in limiters:
            await lim.close()
        for s in shares:
            await s.close()
    assert sum(d.allowed for d in decisions) == 50
    # Merged: far fewer script calls than admissions (75 per gateway, at most PARTS_PER_CALL per call).
    assert calls <= 2 * -(-75 // PARTS_PER_CALL) + 2
    admitted = [d for d in decisions if d.allowed]
    # Each admitted request saw the headroom left after the ones decided before it: 49, 48, ..., 0.
    assert sorted(d.states[0].remaining for d in admitted) == list(range(50))
    assert all(d.retry_after_ms > 0 and d.lease == "" for d in decisions if not d.allowed)


async def test_a_refusal_in_a_merged_call_answers_only_its_own_request(limiter: Limiter) -> None:
    """Ten admissions in one tick, one of them on a bucket already spent: that one is a refusal with a
    retry time and charges nothing; the nine others are admitted and charged."""
    spent = Bucket(scope(), "rpm", 1)
    assert (await limiter.acquire([spent], 0)).allowed
    others = [Bucket(scope(), "rpm", 5) for _ in range(9)]
    calls = [limiter.acquire([b], 0) for b in others[:4]]
    calls.append(limiter.acquire([spent], 0))
    calls += [limiter.acquire([b], 0) for b in others[4:]]
    decisions = await asyncio.gather(*calls)
    refused = decisions[4]
    assert not refused.allowed and 0 < refused.retry_after_ms <= 60_000
    assert refused.states[0].remaining == 0
    assert all(d.allowed and d.states[0].remaining == 4 for i, d in enumerate(decisions) if i != 4)
    after = await limiter.peek([*others, spent])
    assert [s.remaining for s in after] == [4] * 9 + [0]


async def test_leases_taken_and_released_in_merged_calls_hold_the_count(limiter: Limiter) -> None:
    """A concurrency bucket of 3 and six acquires in one tick: three leases; released together in one
    tick (one merged call), the three slots are free again."""
    slots = Bucket(scope(), "concurrent", 3)
    decisions = await asyncio.gather(*(limiter.acquire([slots], 0) for _ in range(6)))
    held = [d.lease for d in decisions if d.allowed]
    assert len(held) == 3 and len(set(held)) == 3
    assert (await limiter.peek([slots]))[0].remaining == 0
    await asyncio.gather(*(limiter.release([slots], lease) for lease in held))
    assert (await limiter.peek([slots]))[0].remaining == 3


async def test_a_merged_call_after_a_script_flush_is_answered(limiter: Limiter, rds: RedisServer) -> None:
    """Redis forgot the script (a restart, SCRIPT FLUSH): the merged call is refused with NOSCRIPT, loaded
    again and resent once; every admission in it is answered, and charged once."""
    rpm = Bucket(scope(), "rpm", 100)
    assert (await limiter.acquire([Bucket(scope(), "rpm", 10)], 0)).allowed
    with rds.client() as r:
        r.script_flush()
    decisions = await asyncio.gather(*(limiter.acquire([rpm], 0) for _ in range(20)))
    assert all(d.allowed for d in decisions)
    assert (await limiter.peek([rpm]))[0].remaining == 80


@pytest.mark.parametrize("count", [PARTS_PER_CALL + 1])
async def test_more_than_one_calls_worth_in_a_tick_is_cut_into_calls(
    limiter: Limiter, rds: RedisServer, count: int
) -> None:
    """One admission more than a call takes: two script calls, every admission decided once."""
    rpm = Bucket(scope(), "rpm", 1000)
    assert (await limiter.acquire([Bucket(scope(), "rpm", 10)], 0)).allowed
    before = evalsha_calls(rds)
    decisions = await asyncio.gather(*(limiter.acquire([rpm], 0) for _ in range(count)))
    assert evalsha_calls(rds) - before == 2
    assert all(d.allowed for d in decisions)
    assert (await limiter.peek([rpm]))[0].remaining == 1000 - count
