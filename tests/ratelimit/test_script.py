"""The GCRA/lease script itself, against a real redis-server, and its in-process twin `_Local`.

The twin's rate arithmetic is `gcra`, the one Python mirror of the script, which `peek_state` (the status
page's read-only headroom) uses too: the differential tests below hold both to the script.

Every number asserted here follows from the algorithm in docs/ratelimits.md: a bucket of L per period P
admits a burst of exactly L, then one unit every P/L; a denied request charges nothing anywhere.
Timing-sensitive facts are bracketed with Redis's own clock (`TIME`), which is what the script reads.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
import uuid

import pytest

from gateway.limits.gcra import _Local
from gateway.limits.rateheaders import duration
from gateway.limits.ratelimit import PERIOD_S, Bucket, Decision, Kind, Limiter
from gateway.state import SharedState
from tests.helpers.redis import RedisServer


def scope() -> str:
    return "test:" + uuid.uuid4().hex[:12]


def remaining(d: Decision) -> list[int]:
    return [s.remaining for s in d.states]


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def interval_ms(b: Bucket) -> float:
    return PERIOD_S[b.kind] * 1000 / b.limit


# --------------------------------------------------------------------------------------------------
# Against Redis


# Limits whose interval P/L is not a whole number of milliseconds included on purpose (rpm 7, 9, 13, 49):
# the burst must still be exactly L.
@pytest.mark.parametrize("limit", [1, 6, 7, 9, 13, 30, 49])
async def test_rpm_burst_is_exactly_the_limit(limiter: Limiter, rds: RedisServer, limit: int) -> None:
    b = Bucket(scope(), "rpm", limit)
    start = rds.time_ms()
    decisions = [await limiter.acquire([b], 0) for _ in range(limit + 2)]
    elapsed = rds.time_ms() - start
    assert elapsed < interval_ms(b), "the burst must finish within one emission interval for exact counts"
    assert [d.allowed for d in decisions] == [True] * limit + [False, False]
    # Remaining after each admission counts down to zero; a denial reports the (empty) bucket as it is.
    assert [remaining(d)[0] for d in decisions] == [*range(limit - 1, -1, -1), 0, 0]
    for denied in decisions[limit:]:
        # The next unit is one emission interval after the burst began.
        assert interval_ms(b) - elapsed - 1 <= denied.retry_after_ms <= math.ceil(interval_ms(b))


@pytest.mark.parametrize("limit", [2, 3, 7])
async def test_rps_admits_one_more_after_the_emission_interval(limiter: Limiter, rds: RedisServer, limit: int) -> None:
    b = Bucket(scope(), "rps", limit)
    start = rds.time_ms()
    burst = [await limiter.acquire([b], 0) for _ in range(limit)]
    denied = await limiter.acquire([b], 0)
    elapsed = rds.time_ms() - start
    assert elapsed < interval_ms(b), "the burst must finish within one emission interval"
    assert all(d.allowed for d in burst) and not denied.allowed
    assert interval_ms(b) - elapsed - 1 <= denied.retry_after_ms <= math.ceil(interval_ms(b))
    await asyncio.sleep(denied.retry_after_ms / 1000)
    again = await limiter.acquire([b], 0)
    after = await limiter.acquire([b], 0)
    assert again.allowed, "waiting Retry-After must be enough"
    assert remaining(again) == [0]
    assert not after.allowed, "exactly one unit came back"
    assert 0 < after.retry_after_ms <= math.ceil(interval_ms(b))


async def test_token_bucket_charges_costs_exactly(limiter: Limiter) -> None:
    b = Bucket(scope(), "tpm", 100)  # 600 ms per token: nothing refills within this test
    seq = [(30, True, 70), (30, True, 40), (30, True, 10), (20, False, 10), (10, True, 0), (1, False, 0)]
    first = await limiter.acquire([b], 30)
    assert (first.allowed, remaining(first), first.states[0].reset_ms) == (True, [70], 30 * 600)
    decisions = [first] + [await limiter.acquire([b], cost) for cost, _, _ in seq[1:]]
    assert [(d.allowed, remaining(d)[0]) for d in decisions] == [(ok, left) for _, ok, left in seq]
    # 20 tokens over a bucket holding 10: 10 more tokens must drip back (6 s); 1 over an empty one: 0.6 s.
    assert 6000 - 50 <= decisions[3].retry_after_ms <= 6000
    assert 600 - 50 <= decisions[5].retry_after_ms <= 600


async def test_refund_makes_room_and_overuse_is_charged(limiter: Limiter) -> None:
    tokens = Bucket(scope(), "tpm", 100)
    requests = Bucket(scope(), "rpm", 10)
    both = [requests, tokens]
    assert (await limiter.acquire(both, 100)).allowed
    assert not (await limiter.acquire(both, 10)).allowed
    await limiter.adjust(both, -40)  # the answer used 60 of the 100 reserved
    back = await limiter.acquire(both, 40)
    assert (back.allowed, remaining(back)) == (True, [8, 0]), "a refund returns tokens, never requests"
    assert not (await limiter.acquire(both, 1)).allowed
    # A refund larger than what the bucket holds empties it, no further.
    await limiter.adjust(both, -1000)
    full = await limiter.acquire([tokens], 100)
    assert (full.allowed, remaining(full)) == (True, [0])
    await limiter.adjust([tokens], -100)
    # Overuse is charged without a check and pushes the bucket past full: the next request waits for it.
    assert (await limiter.acquire([tokens], 50)).allowed
    await limiter.adjust([tokens], 70)
    over = await limiter.acquire([tokens], 1)
    assert not over.allowed and remaining(over) == [0]
    assert 21 * 600 - 50 <= over.retry_after_ms <= 21 * 600


async def test_concurrency_leases(limiter: Limiter, rds: RedisServer) -> None:
    b = Bucket(scope(), "concurrent", 2)
    d1, d2, d3 = [await limiter.acquire([b], 0) for _ in range(3)]
    assert [d.allowed for d in (d1, d2, d3)] == [True, True, False]
    assert remaining(d1) == [1] and remaining(d2) == [0]
    # A slot frees when some request ends, which nobody can predict: a short retry, not the lease's TTL.
    assert 1 <= d3.retry_after_ms <= 1000
    r = rds.client()
    assert r.zcard(b.redis_key) == 2
    assert 0 < r.pttl(b.redis_key) <= 600_000
    assert set(r.zrange(b.redis_key, 0, -1)) == {d1.lease, d2.lease}
    await limiter.release([b], d1.lease)
    assert r.zcard(b.redis_key) == 1
    d4 = await limiter.acquire([b], 0)
    assert d4.allowed and not (await limiter.acquire([b], 0)).allowed
    await limiter.release([b], "no-such-lease")
    assert set(r.zrange(b.redis_key, 0, -1)) == {d2.lease, d4.lease}
    await limiter.release([b], d2.lease)
    await limiter.release([b], d4.lease)
    assert r.zcard(b.redis_key) == 0
    r.close()


async def test_denied_request_charges_no_bucket(limiter: Limiter, rds: RedisServer) -> None:
    s = scope()
    wide = Bucket(s, "rpm", 10)
    narrow = Bucket(s, "rps", 1)
    tokens = Bucket(s, "tpm", 1000)
    slots = Bucket(s, "concurrent", 5)
    r = rds.client()
    first = await limiter.acquire([wide, narrow, tokens, slots], 10)
    assert first.allowed and remaining(first) == [9, 0, 990, 4]
    before = (r.get(wide.redis_key), r.get(tokens.redis_key), r.zcard(slots.redis_key))
    denied = await limiter.acquire([wide, narrow, tokens, slots], 10)
    assert not denied.allowed
    assert (r.get(wide.redis_key), r.get(tokens.redis_key), r.zcard(slots.redis_key)) == before
    # The denial reports the buckets as they are, not as they would have been.
    assert remaining(denied)[:3] == [9, 0, 990]
    # The same buckets without the full one: exactly one request and 10 tokens were charged so far.
    second = await limiter.acquire([wide, tokens], 10)
    assert second.allowed and remaining(second) == [8, 980]
    # A concurrency bucket that is full charges no rate bucket either (whatever its position).
    one = Bucket(scope(), "concurrent", 1)
    rate = Bucket(one.scope, "rpm", 10)
    assert (await limiter.acquire([one, rate], 0)).allowed
    assert not (await limiter.acquire([one, rate], 0)).allowed
    assert not (await limiter.acquire([rate, one], 0)).allowed
    assert remaining(await limiter.acquire([rate], 0)) == [8]
    r.close()


async def test_denial_waits_for_the_slowest_bucket(limiter: Limiter) -> None:
    """All or nothing: Retry-After is when every bucket has room, whatever order the buckets come in."""
    s = scope()
    slow = Bucket(s, "rpm", 1)  # next unit in 60 s
    slots = Bucket(s, "concurrent", 1)
    first = await limiter.acquire([slots, slow], 0)
    assert first.allowed
    for order in ([slots, slow], [slow, slots]):
        d = await limiter.acquire(order, 0)
        assert not d.allowed
        assert 59_000 <= d.retry_after_ms <= 60_000, order


async def test_keys_are_hash_tagged_per_scope_with_ttls(limiter: Limiter, rds: RedisServer) -> None:
    rpm = Bucket("key:search-team", "rpm", 30)
    tpd = Bucket("key:search-team", "tpd", 86_400)
    slots = Bucket("key:search-team", "concurrent", 3)
    assert (await limiter.acquire([rpm, tpd, slots], 5)).allowed
    r = rds.client()
    assert sorted(r.keys("rl:*")) == [
        "rl:{key:search-team}:concurrent",
        "rl:{key:search-team}:rpm",
        "rl:{key:search-team}:tpd",
    ]
    # Each key lives as long as its bucket holds anything, plus a second; no key outlives its meaning.
    assert 2000 < r.pttl(rpm.redis_key) <= 3000
    assert 5000 < r.pttl(tpd.redis_key) <= 6000
    assert 599_000 < r.pttl(slots.redis_key) <= 600_000
    r.close()


async def test_script_is_reloaded_after_script_flush(limiter: Limiter, rds: RedisServer) -> None:
    b = Bucket(scope(), "rpm", 3)
    assert (await limiter.acquire([b], 0)).allowed
    r = rds.client()
    r.script_flush()
    assert (await limiter.acquire([b], 0)).allowed  # NOSCRIPT -> SCRIPT LOAD, transparently
    d = await limiter.acquire([b], 0)
    assert (d.allowed, remaining(d)) == (True, [0])
    assert not (await limiter.acquire([b], 0)).allowed
    r.close()


# --------------------------------------------------------------------------------------------------
# The in-process twin, on a clock the test drives


class Clock:
    def __init__(self, ms: int = 1_700_000_000_000) -> None:
        self.ms = ms

    def __call__(self) -> float:
        # Half a millisecond in, so seconds * 1000 never rounds below the intended millisecond.
        return (self.ms + 0.5) / 1000


def local_acquire(local: _Local, buckets: list[Bucket], tokens: int = 0, lease: str = "") -> list[int]:
    costs = [float(tokens) if b.kind in ("tpm", "tpd") else 1.0 for b in buckets]
    return local.run("acquire", lease or uuid.uuid4().hex, buckets, costs)


@pytest.mark.parametrize(("kind", "limit"), [("rps", 7), ("rps", 6), ("rps", 1000), ("rpm", 9), ("rpm", 13)])
def test_local_admits_exactly_l_plus_t_l_over_p(kind: Kind, limit: int) -> None:
    """Driven every millisecond for ten periods: exactly L + t·L/P admissions, never one more or fewer."""
    clock = Clock()
    local = _Local(clock)
    b = Bucket("s", kind, limit)
    period = int(PERIOD_S[kind] * 1000)
    step = 1 if kind == "rps" else 7
    admitted: list[int] = []
    span = 10 * period if kind == "rps" else period
    for t in range(0, span + 1, step):
        clock.ms = 1_700_000_000_000 + t
        while local_acquire(local, [b])[0] == 1:
            admitted.append(t)
    # Admission k (0-based) happens at the first tick at or after (k - L + 1)·P/L.
    expected = [0] * limit
    k = 1
    while (tick := ceil_div(ceil_div(k * period, limit), step) * step) <= span:
        expected.append(tick)
        k += 1
    assert admitted == expected


def test_local_retry_after_is_exact_for_fractional_intervals() -> None:
    clock = Clock()
    local = _Local(clock)
    b = Bucket("s", "rps", 7)  # 142.857 ms per request
    for _ in range(7):
        assert local_acquire(local, [b])[0] == 1
    denied = local_acquire(local, [b])
    assert denied[:2] == [0, 143]
    clock.ms += 142
    assert local_acquire(local, [b])[:2] == [0, 1]
    clock.ms += 1
    assert local_acquire(local, [b])[0] == 1
    # The next one is due 2 x 142.857 = 285.71 ms after the start: 143 ms from here.
    assert local_acquire(local, [b])[:2] == [0, 143]


def test_local_concurrency_leases_and_expiry() -> None:
    clock = Clock()
    local = _Local(clock)
    b = Bucket("s", "concurrent", 1)
    assert local_acquire(local, [b], lease="a")[:3] == [1, 0, 0]
    assert local_acquire(local, [b], lease="b")[0] == 0
    local.run("release", "a", [b], [0.0])
    assert local_acquire(local, [b], lease="c")[0] == 1
    # A lease nobody released (a dead replica) frees itself after ten minutes.
    clock.ms += 600_001
    assert local_acquire(local, [b], lease="d")[0] == 1


# --------------------------------------------------------------------------------------------------
# Differential: the script and `_Local` decide the same for the same sequence


async def test_local_twin_decides_like_the_script(rds: RedisServer) -> None:
    rng = random.Random(4)
    s = scope()
    # Token buckets per day (intervals of 10 s and more, some not whole milliseconds) and requests per
    # minute (6.7 s and more): a sequence of a few seconds cannot cross one, even on a loaded machine,
    # so both sides must agree exactly on decisions and remaining.
    pool = [
        Bucket(s, "rpm", 7),
        Bucket(s, "rpm", 9),
        Bucket(s, "tpd", 70),
        Bucket(s, "tpd", 8640),
        Bucket(s, "concurrent", 3),
        Bucket(s + "b", "concurrent", 2),
        Bucket(s + "b", "tpd", 130),
    ]
    shared = SharedState(rds.url)
    remote = Limiter(shared, fail_open=False)
    clock = Clock()
    local = Limiter(SharedState(""), clock=clock)
    held: list[tuple[list[Bucket], str, str]] = []
    start = rds.time_ms()
    outcomes: list[bool] = []
    try:
        for step in range(120):
            op = rng.random()
            buckets = rng.sample(pool, rng.randint(1, 3))
            if op < 0.15 and held:
                chosen, lease_r, lease_l = held.pop(rng.randrange(len(held)))
                await remote.release(chosen, lease_r)
                await local.release(chosen, lease_l)
                continue
            if op < 0.3:
                delta = rng.randint(-40, 25)
                clock.ms = rds.time_ms()
                await remote.adjust(buckets, delta)
                await local.adjust(buckets, delta)
                continue
            tokens = rng.randint(1, 40)
            clock.ms = before = rds.time_ms()
            d_remote = await remote.acquire(buckets, tokens)
            d_local = await local.acquire(buckets, tokens)
            drift = rds.time_ms() - start + 1
            where = f"step {step}: {[(b.scope, b.kind, b.limit) for b in buckets]} tokens={tokens}"
            assert d_local.allowed == d_remote.allowed, where
            assert remaining(d_local) == remaining(d_remote), where
            assert abs(d_local.retry_after_ms - d_remote.retry_after_ms) <= drift, where
            for a, b in zip(d_local.states, d_remote.states, strict=True):
                assert abs(a.reset_ms - b.reset_ms) <= drift, where
            if d_remote.allowed:
                held.append((buckets, d_remote.lease, d_local.lease))
            outcomes.append(d_remote.allowed)
            assert before - start < 6000, "the sequence must stay shorter than the shortest interval"
    finally:
        await remote.close()
        await shared.close()
    # The sequence exercised both answers, many times.
    assert outcomes.count(True) >= 20 and outcomes.count(False) >= 20, outcomes


async def test_peek_mirrors_what_the_script_stored(rds: RedisServer) -> None:
    """`Limiter.peek` applies the mirror to the TATs the script wrote in Redis; the twin to its own. Both
    must agree with each other and with the headroom the script itself reports for a cost of 0."""
    rng = random.Random(7)
    s = scope()
    # Intervals of 6.7 s and more: nothing refills within the sequence, even on a loaded machine, so both
    # sides see the same state.
    pool = [Bucket(s, "rpm", 7), Bucket(s, "rpm", 9), Bucket(s, "tpd", 45), Bucket(s + "b", "tpd", 30)]
    shared = SharedState(rds.url)
    remote = Limiter(shared, fail_open=False)
    clock = Clock()
    local = Limiter(SharedState(""), clock=clock)
    start = rds.time_ms()
    try:
        for step in range(25):
            buckets = rng.sample(pool, rng.randint(1, 3))
            tokens = rng.randint(1, 40)
            clock.ms = rds.time_ms()
            if rng.random() < 0.3:
                await remote.adjust(buckets, tokens - 25)
                await local.adjust(buckets, tokens - 25)
            else:
                await remote.acquire(buckets, tokens)
                await local.acquire(buckets, tokens)
            clock.ms = rds.time_ms()
            p_remote, p_local = await remote.peek(pool), await local.peek(pool)
            # A zero-cost acquire is the script's own read of the same state (it charges requests, hence
            # only the token buckets).
            tpd = [b for b in pool if b.kind == "tpd"]
            own = await remote.acquire(tpd, 0)
            drift = rds.time_ms() - start + 1
            where = f"step {step}: {[(b.scope, b.kind, b.limit) for b in buckets]} tokens={tokens}"
            assert [p.remaining for p in p_local] == [p.remaining for p in p_remote], where
            assert [p.remaining for p in p_remote if p.bucket.kind == "tpd"] == remaining(own), where
            for a, b in zip(p_local, p_remote, strict=True):
                assert abs(a.reset_ms - b.reset_ms) <= drift, where
            assert clock.ms - start < 6000, "the sequence must stay shorter than the shortest interval"
    finally:
        await remote.close()
        await shared.close()


def test_local_clock_defaults_to_wall_time() -> None:
    local = _Local(time.time)
    out = local_acquire(local, [Bucket("s", "rpm", 2)])
    assert out == [1, 0, 1, 30_000]


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        (0, "0ms"),
        (20, "20ms"),
        (999, "999ms"),
        (1000, "1s"),
        (1500, "1.5s"),
        (2250, "2.25s"),
        (59_999, "59.999s"),
        (60_000, "1m0s"),
        (360_000, "6m0s"),
        (361_999, "6m1s"),
    ],
)
def test_reset_durations_use_openais_format(ms: int, text: str) -> None:
    assert duration(ms) == text
