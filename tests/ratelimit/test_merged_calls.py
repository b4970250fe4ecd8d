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

from gateway.limits.gcra import Decision
from gateway.limits.ratelimit import Bucket, Limiter
from gateway.limits.script import script_text
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


async def ten_in_one_tick(limiter: Limiter, rds: RedisServer, rpm: Bucket) -> tuple[int, list[Decision]]:
    """Ten acquires on `rpm` issued in one tick, after a first call that connects and loads the script: the
    script calls Redis ran for them, and their decisions."""
    assert (await limiter.acquire([Bucket(scope(), "rpm", 10)], 0)).allowed
    before = evalsha_calls(rds)
    decisions = await asyncio.gather(*(limiter.acquire([rpm], 0) for _ in range(10)))
    return evalsha_calls(rds) - before, decisions


async def test_calls_made_while_other_requests_are_in_flight_still_wait_for_the_tick_to_merge(
    limiter: Limiter, rds: RedisServer
) -> None:
    """The gateway tells the limiter whether one request at most is in flight (`solo`); while others are,
    the calls of one tick still go as one script call."""
    limiter.solo(lambda: False)
    calls, decisions = await ten_in_one_tick(limiter, rds, Bucket(scope(), "rpm", 100))
    assert calls == 1
    assert all(d.allowed for d in decisions)


async def test_a_lone_request_s_call_leaves_at_once_and_decides_the_same(limiter: Limiter, rds: RedisServer) -> None:
    """With one request in flight nothing can join its call, so it is written when made, not at the tick's
    end (a loop turn saved on every lone request). Calls made that way go one script call each, and are
    decided exactly as merged ones: ten acquires on an rpm of 6, six admitted, remaining 5 down to 0."""
    limiter.solo(lambda: True)
    rpm = Bucket(scope(), "rpm", 6)
    calls, decisions = await ten_in_one_tick(limiter, rds, rpm)
    assert calls == 10
    assert [d.allowed for d in decisions] == [True] * 6 + [False] * 4
    assert [d.states[0].remaining for d in decisions[:6]] == [5, 4, 3, 2, 1, 0]
    assert (await limiter.peek([rpm]))[0].remaining == 0


# One script call at the level of its arguments: (mode, lease, [(key name, kind, limit, period ms, cost)]).
Call = tuple[str, str, list[tuple[str, str, int, int, float]]]


def _argv(prefix: str, call: Call) -> tuple[list[str], list[str | int | float]]:
    mode, lease, buckets = call
    argv: list[str | int | float] = [mode, lease]
    for _, kind, limit, period, cost in buckets:
        argv += [kind, limit, period, cost]
    return [prefix + name for name, *_ in buckets], argv


def _state(rds: RedisServer, prefix: str, names: list[str]) -> dict[str, tuple[object, int]]:
    """Every key's value (a rate bucket's `base:units`, a lease set's members and scores) and PTTL."""
    out: dict[str, tuple[object, int]] = {}
    with rds.client() as r:
        for name in names:
            key = prefix + name
            value = r.get(key) if r.type(key) == "string" else dict(r.zrange(key, 0, -1, withscores=True))
            out[name] = (value, r.pttl(key))
    return out


def _commands(rds: RedisServer) -> dict[str, int]:
    with rds.client() as r:
        stats = r.info("commandstats")
    return {c: int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("get", "set")}


async def test_a_batch_on_shared_keys_leaves_what_the_calls_one_by_one_leave(rds: RedisServer) -> None:
    """Eighteen calls on a few shared keys, as one batch and one by one on twin keys: the same replies
    and the same final Redis state (clock readings within the time both runs took). Among them a refused
    part in the middle, a refund and an overuse charge, lease and rate buckets in one call, a release, a
    refresh, and two acquires that meet their lease's cancel marker (all-or-nothing: their rate buckets
    are not charged). The batch reads and writes each rate bucket once."""
    hour = 3_600_000  # emission intervals of seconds: the runs' few ms apart change no count
    r6, t1000, o100 = ("r", "rpm", 6, 60_000), ("t", "tpm", 1000, hour), ("o", "rpm", 100, 60_000)
    c2, d5 = ("c", "concurrent", 2, 0), ("d", "concurrent", 5, 0)
    calls: list[Call] = [
        ("acquire", "", [(*r6, 1), (*t1000, 300)]),
        ("acquire", "", [(*r6, 1), (*t1000, 300)]),
        ("acquire", "", [(*o100, 1)]),
        ("acquire", "", [(*r6, 1), (*t1000, 600)]),  # refused: 1200 tokens of 1000
        ("adjust", "", [(*t1000, -200)]),  # a refund
        ("acquire", "L1", [(*c2, 1), (*r6, 1)]),
        ("acquire", "", [(*r6, 1), (*t1000, 500)]),  # fits only after the refund
        ("acquire", "L2", [(*c2, 1), (*r6, 1)]),
        ("acquire", "L3", [(*c2, 1), (*r6, 1)]),  # refused by the lease bucket: r is not charged
        ("acquire", "L4", [(*d5, 1), (*o100, 1), (*t1000, 50)]),  # meets L4's cancel marker: nothing written
        ("acquire", "", [(*r6, 1)]),  # the 6th request of 6
        ("acquire", "", [(*r6, 1)]),  # refused
        ("adjust", "", [(*o100, 2), (*t1000, 50)]),  # overuse charged after the fact
        ("release", "L1", [(*c2, 0)]),
        ("acquire", "L5", [(*c2, 1)]),
        ("refresh", "L2", [(*c2, 0)]),
        ("cancel", "L9", [(*d5, 0)]),
        ("acquire", "L9", [(*d5, 1), (*o100, 1)]),  # sent before its cancel, run after: nothing written
    ]
    names = ["r", "t", "o", "c", "d"]
    with rds.client() as r:
        sha = r.script_load(script_text(600_000))
        start = rds.time_ms()
        single_prefix, batch_prefix = "{rl}:" + uuid.uuid4().hex[:8] + ":", "{rl}:" + uuid.uuid4().hex[:8] + ":"
        for prefix in (single_prefix, batch_prefix):  # L4's acquire comes after its cancel
            r.evalsha(sha, *_argv_call(prefix, ("cancel", "L4", [(*d5, 0)])))
        one_by_one = [r.evalsha(sha, *_argv_call(single_prefix, call)) for call in calls]
        keys: list[str] = []
        argv: list[str | int | float] = ["batch"]
        for call in calls:
            k, a = _argv(batch_prefix, call)
            keys += k
            argv += [len(k), *a]
        before = _commands(rds)
        batched = r.evalsha(sha, len(keys), *keys, *argv)
        after = _commands(rds)
    singles, merged_state = _state(rds, single_prefix, names), _state(rds, batch_prefix, names)
    tolerance = rds.time_ms() - start + 1  # the calls ran, and their TTLs were read, within this
    assert after["get"] - before["get"] == 3 and after["set"] - before["set"] == 3, "each rate bucket once"
    assert [reply[0] for reply in one_by_one] == [1, 1, 1, 0, 1, 1, 1, 1, 0, 0, 1, 0, 1, 1, 1, 1, 1, 0]
    assert len(batched) == len(one_by_one)
    for single, merged in zip(one_by_one, batched, strict=True):
        assert len(single) == len(merged)
        assert (single[0], single[2::2]) == (merged[0], merged[2::2]), "allowed and remaining exactly"
        for x, y in zip([single[1], *single[3::2]], [merged[1], *merged[3::2]], strict=True):
            assert abs(x - y) <= tolerance, "retry and reset ms: the same but for the clock"
    for name in names:
        (value, pttl), (value2, pttl2) = singles[name], merged_state[name]
        assert abs(pttl - pttl2) <= tolerance, name
        if isinstance(value, str):
            assert isinstance(value2, str)
            base, units = value.split(":")
            base2, units2 = value2.split(":")
            assert units == units2 and abs(float(base) - float(base2)) <= tolerance, name
        else:
            assert isinstance(value, dict) and isinstance(value2, dict)
            assert sorted(value) == sorted(value2), name
            assert all(abs(value[m] - value2[m]) <= tolerance for m in value), name
    c, d = singles["c"][0], singles["d"][0]
    assert isinstance(c, dict) and sorted(c) == ["L2", "L5"]
    assert isinstance(d, dict) and sorted(m for m, score in d.items() if score > 0) == [], "only cancel markers"


def _argv_call(prefix: str, call: Call) -> list[str | int | float]:
    keys, argv = _argv(prefix, call)
    return [len(keys), *keys, *argv]
