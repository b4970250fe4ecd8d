"""A bucket seen through a share (`Bucket.share`, a batch line's view of a shared quota: `batches.quota_share`)
admits only while the bucket, with the charge, holds at most that share of its burst; the same bucket seen
whole still admits up to all of it. The script's "share" mode on a real redis-server, its in-process twin,
and the two held to each other decision by decision."""

from __future__ import annotations

import math
import random
import uuid
from collections.abc import AsyncIterator

import msgspec
import pytest

from gateway.limits.gcra import PERIOD_S
from gateway.limits.ratelimit import Bucket, Limiter
from gateway.state import SharedState
from tests.helpers.redis import RedisServer


def scope() -> str:
    return "test:" + uuid.uuid4().hex[:12]


def through(b: Bucket, share: float) -> Bucket:
    return msgspec.structs.replace(b, share=share)


class Clock:
    """The in-process limiter's clock, pinned: no unit drains back while a test runs."""

    def __init__(self, ms: int = 1_700_000_000_000) -> None:
        self.ms = ms

    def __call__(self) -> float:
        return (self.ms + 0.5) / 1000


@pytest.fixture(params=["redis", "in-process"])
async def either(request: pytest.FixtureRequest) -> AsyncIterator[Limiter]:
    """The limiter on the session's redis-server (fail closed: a Redis problem fails the test), or in process."""
    if request.param == "in-process":
        here = Limiter(SharedState(""), clock=Clock())
        yield here
        await here.close()
        return
    rds: RedisServer = request.getfixturevalue("rds")
    shared = SharedState(rds.url)
    made = Limiter(shared, fail_open=False)
    try:
        yield made
    finally:
        await made.close()
        await shared.close()


# rpm 10 at 0.5: 5 units; 0.3 is read as the decimal written (3 of 10, not the float just below 0.3, which
# would leave 2); rpm 7 at 0.5: 3 (3.5 rounded down); 1.0 is the whole bucket. A share of less than one unit
# (rpm 10 at 0.05, rpm 1 at 0.5) holds one: a line goes through while the bucket is empty.
@pytest.mark.parametrize(
    ("limit", "share", "part"), [(10, 0.5, 5), (10, 0.3, 3), (7, 0.5, 3), (9, 1.0, 9), (10, 0.05, 1), (1, 0.5, 1)]
)
async def test_a_share_admits_exactly_its_part_and_leaves_the_rest_to_the_whole_view(
    either: Limiter, limit: int, share: float, part: int
) -> None:
    whole = Bucket(scope(), "rpm", limit)
    batch = through(whole, share)
    taken = [await either.acquire([batch], 0) for _ in range(part + 2)]
    assert [d.allowed for d in taken] == [True] * part + [False, False]
    # The rest of the burst is still there for the bucket seen whole, and nothing more.
    rest = [await either.acquire([whole], 0) for _ in range(limit - part + 1)]
    assert [d.allowed for d in rest] == [True] * (limit - part) + [False]
    # The share's refusal waits for the bucket to drain to where one more unit fits under its ceiling: at most
    # one emission interval (less where the ceiling is not a whole number of units).
    assert 0 < taken[-1].retry_after_ms <= math.ceil(PERIOD_S["rpm"] * 1000 / limit)


async def test_a_full_bucket_refuses_its_share_and_the_share_waits_longer(either: Limiter) -> None:
    """Interactive requests that filled the bucket leave the share nothing, and the share's wait is until the
    bucket is back down to its ceiling, not until the next unit."""
    whole = Bucket(scope(), "rpm", 6)  # one unit every 10 s
    assert all([(await either.acquire([whole], 0)).allowed for _ in range(6)])
    refused = await either.acquire([through(whole, 0.5)], 0)
    assert not refused.allowed
    # Six held, a ceiling of three: four units must drain (40 s) before one more fits under it.
    assert 39_000 <= refused.retry_after_ms <= 40_000


async def test_a_token_share_admits_its_tokens_exactly(either: Limiter) -> None:
    tokens = Bucket(scope(), "tpm", 100)  # 600 ms per token: nothing drains within the test
    batch = through(tokens, 0.5)
    assert (await either.acquire([batch], 30)).allowed
    assert not (await either.acquire([batch], 21)).allowed
    assert (await either.acquire([batch], 20)).allowed  # 50: the share's whole part
    assert not (await either.acquire([batch], 1)).allowed
    assert (await either.acquire([tokens], 50)).allowed
    assert not (await either.acquire([tokens], 1)).allowed


async def test_a_concurrency_share_holds_its_part_of_the_slots(either: Limiter) -> None:
    slots = Bucket(scope(), "concurrent", 4)
    batch = through(slots, 0.5)
    held = [await either.acquire([batch], 0) for _ in range(3)]
    assert [d.allowed for d in held] == [True, True, False]
    # The whole view still finds the other two.
    whole = [await either.acquire([slots], 0) for _ in range(3)]
    assert [d.allowed for d in whole] == [True, True, False]
    # The share counts every slot held, whoever holds it: with three held, one freed is not the share's.
    await either.release([batch], held[0].lease)
    assert not (await either.acquire([batch], 0)).allowed
    for d in whole[:2]:
        await either.release([slots], d.lease)
    assert (await either.acquire([batch], 0)).allowed
    assert not (await either.acquire([batch], 0)).allowed


async def test_a_share_of_less_than_one_unit_admits_only_into_an_empty_bucket(either: Limiter) -> None:
    """rpm 10 at 0.05 is half a request: the share holds one, and only while nothing else is in the bucket."""
    whole = Bucket(scope(), "rpm", 10)  # one unit every 6 s: nothing drains within the test
    batch = through(whole, 0.05)
    assert (await either.acquire([whole], 0)).allowed
    refused = await either.acquire([batch], 0)
    assert not refused.allowed
    # The interactive request's unit must drain first: one emission interval.
    assert 5_000 <= refused.retry_after_ms <= 6_000
    assert [(await either.acquire([whole], 0)).allowed for _ in range(10)] == [True] * 9 + [False]


async def test_a_concurrency_share_of_less_than_one_slot_holds_one_while_none_is_held(either: Limiter) -> None:
    slots = Bucket(scope(), "concurrent", 3)
    batch = through(slots, 0.2)  # 0.6 of a slot
    other = await either.acquire([slots], 0)
    assert other.allowed
    assert not (await either.acquire([batch], 0)).allowed
    await either.release([slots], other.lease)
    line = await either.acquire([batch], 0)
    assert line.allowed
    assert not (await either.acquire([batch], 0)).allowed
    # The whole view still finds the other two slots.
    assert [(await either.acquire([slots], 0)).allowed for _ in range(3)] == [True, True, False]


async def test_a_set_is_refused_whole_when_one_share_is_full(either: Limiter) -> None:
    """All or nothing, as ever: a batch's own bucket (seen whole) is not charged when a shared one refuses."""
    own = Bucket(scope(), "rpm", 100)
    shared = through(Bucket(scope(), "rpm", 4), 0.5)
    assert [(await either.acquire([own, shared], 0)).allowed for _ in range(3)] == [True, True, False]
    left = await either.acquire([own], 0)
    assert [s.remaining for s in left.states] == [97]


async def test_the_request_paths_call_uses_the_share(rds: RedisServer) -> None:
    """`acquiring` (Redis answering, no lease: admission's common case) and `decided` (no Redis) send the
    compiled set's own command, the share's included."""
    shared = SharedState(rds.url)
    remote = Limiter(shared, fail_open=False)
    here = Limiter(SharedState(""), clock=Clock())
    try:
        for limiter in (remote, here):
            b = Bucket(scope(), "rpm", 10)
            bset = limiter.compiled([through(b, 0.5)])
            outs = []
            for _ in range(6):
                pending = limiter.acquiring(bset, 0)
                out = limiter.decided(bset, 0) if pending is None else await pending
                assert out is not None
                outs.append(out[0])
            assert outs == [1] * 5 + [0]
    finally:
        await remote.close()
        await here.close()
        await shared.close()


async def test_the_in_process_twin_decides_shares_like_the_script(rds: RedisServer) -> None:
    rng = random.Random(11)
    s = scope()
    rpm7, tpd = Bucket(s, "rpm", 7), Bucket(s, "tpd", 8640)
    slots = Bucket(s + "c", "concurrent", 3)
    # Each bucket whole and through shares (0.3 of 8640 tokens a day is 2592: the decimal, exactly).
    # A share of less than one request holds one (rpm 2 at 0.25, 3 slots at 0.2).
    rpm2 = Bucket(s + "t", "rpm", 2)
    pool = [
        *(rpm7, through(rpm7, 0.5), tpd, through(tpd, 0.3), slots, through(slots, 0.7), Bucket(s + "b", "rpm", 9)),
        *(rpm2, through(rpm2, 0.25), through(slots, 0.2)),
    ]
    shared = SharedState(rds.url)
    remote = Limiter(shared, fail_open=False)
    clock = Clock()
    local = Limiter(SharedState(""), clock=clock)
    held: list[tuple[list[Bucket], str, str]] = []
    start = rds.time_ms()
    outcomes: list[bool] = []
    try:
        for step in range(150):
            buckets = rng.sample(pool, rng.randint(1, 3))
            if len({b.redis_key for b in buckets}) < len(buckets):
                continue  # one bucket twice in a call: not what any caller sends
            if rng.random() < 0.15 and held:
                chosen, lease_r, lease_l = held.pop(rng.randrange(len(held)))
                await remote.release(chosen, lease_r)
                await local.release(chosen, lease_l)
                continue
            tokens = rng.randint(1, 600)
            clock.ms = rds.time_ms()
            d_remote = await remote.acquire(buckets, tokens)
            d_local = await local.acquire(buckets, tokens)
            where = f"step {step}: {[(b.kind, b.limit, b.share) for b in buckets]} tokens={tokens}"
            assert d_local.allowed == d_remote.allowed, where
            assert [x.remaining for x in d_local.states] == [x.remaining for x in d_remote.states], where
            assert abs(d_local.retry_after_ms - d_remote.retry_after_ms) <= rds.time_ms() - start + 1, where
            if d_remote.allowed:
                held.append((buckets, d_remote.lease, d_local.lease))
            outcomes.append(d_remote.allowed)
        assert rds.time_ms() - start < 6000, "the sequence must stay shorter than the shortest interval"
    finally:
        await remote.close()
        await local.close()
        await shared.close()
    assert outcomes.count(True) >= 15 and outcomes.count(False) >= 15, outcomes
