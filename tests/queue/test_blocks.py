"""With Redis, far below its cap a process takes its leases in blocks and hands them out itself: one script
call for several requests, the cap still exact across processes, a dead holder's block back by expiry, and
one lease per request again near the cap."""

from __future__ import annotations

import asyncio
import contextlib
import time

import redis.asyncio as aioredis

from gateway.limits.ratelimit import Bucket, Limiter, RedisDown
from gateway.queue.fair import Waiter
from gateway.queue.gate import BLOCK_MAX, TRIM_S, Gate, Slot
from gateway.state import SharedState
from tests.helpers.redis import RedisServer

KEY = "rl:{queue:engine}:concurrent"


def _waiter() -> Waiter:
    return Waiter("tenant", 1.0, 1, 10, asyncio.get_running_loop().create_future(), time.monotonic())


async def _held(rds: RedisServer, client: aioredis.Redis | None = None) -> list[str]:
    """The live leases Redis holds for the server."""
    mine = client or aioredis.Redis.from_url(rds.url)
    try:
        now = (await mine.time())[0] * 1000
        members = await mine.zrangebyscore(KEY, now, "+inf")
        return [m.decode() for m in members if isinstance(m, bytes)]
    finally:
        if client is None:
            await mine.aclose()


async def test_two_processes_taking_blocks_never_pass_the_cap(rds: RedisServer) -> None:
    states = [SharedState(rds.url), SharedState(rds.url)]
    limiters = [Limiter(s, fail_open=False) for s in states]
    gates = [Gate("engine", 16, limiter, None) for limiter in limiters]
    client = aioredis.Redis.from_url(rds.url)
    try:
        running = peak = 0

        async def one(gate: Gate) -> None:
            nonlocal running, peak
            taken = await gate.take(_waiter())
            if taken is None:  # full: wait in the queue, as a request does
                w = _waiter()
                gate.enqueue(w)
                taken = await asyncio.wait_for(w.future, 60)
            assert taken is not None
            slot: Slot = taken
            running += 1
            peak = max(peak, running, len(await _held(rds, client)) - sum(len(g.spare) for g in gates))
            await asyncio.sleep(0.01)
            running -= 1
            slot.done(10)

        firsts = [await gate.take(_waiter()) for gate in gates]  # far from full: each process takes a block
        assert all(s is not None and s.pooled for s in firsts) and [g.blocks for g in gates] == [1, 1]
        for first in firsts:
            assert first is not None
            first.done(10)
        await asyncio.gather(*(one(gates[i % 2]) for i in range(100)))
        assert 8 < peak <= 16  # busy, never past the cap, spares of blocks not counted as running
        assert len(await _held(rds)) <= 8 + 2  # in blocks, at most half the cap (and a block) stays held
    finally:
        await client.aclose()
        for gate in gates:
            await gate.close()
        for limiter in limiters:
            await limiter.close()
        for state in states:
            await state.close()
    assert await _held(rds) == []  # shutdown gave every spare lease back


async def test_far_below_the_cap_one_call_serves_a_block_and_spares_go_back_when_demand_drops(
    rds: RedisServer,
) -> None:
    state = SharedState(rds.url)
    limiter = Limiter(state, fail_open=False)
    gate = Gate("engine", 32, limiter, None)  # blocks of 4
    try:
        first = await gate.take(_waiter())
        assert first is not None and first.pooled and gate.blocks == 1
        held = await _held(rds)
        assert len(held) == 4 and all("/" in lease for lease in held)
        slots: list[Slot] = [first]
        for _ in range(3):  # the rest of the block: no further block, nothing new in Redis
            slot = await gate.take(_waiter())
            assert slot is not None and slot.pooled
            slots.append(slot)
        assert gate.blocks == 1 and sorted(await _held(rds)) == sorted(held)
        for slot in slots:
            slot.done(10)
        assert sorted(gate.spare) == sorted(held)  # back to this process, not to Redis
        await asyncio.sleep(TRIM_S * 2.5)  # a look that keeps what was used at once, then one that does not
        assert gate.spare == [] and gate.pooled == 0 and await _held(rds) == []
    finally:
        await gate.close()
        await limiter.close()
        await state.close()


async def test_a_cap_far_above_the_load_takes_blocks_of_at_most_block_max(rds: RedisServer) -> None:
    """A cap of 100,000 (an operator's "never queue here") moves BLOCK_MAX leases, not 12,500."""
    state = SharedState(rds.url)
    limiter = Limiter(state, fail_open=False)
    gate = Gate("engine", 100_000, limiter, None)
    try:
        first = await gate.take(_waiter())
        assert first is not None and first.pooled and gate.blocks == 1
        assert len(await _held(rds)) == BLOCK_MAX and len(gate.spare) == BLOCK_MAX - 1
        slots: list[Slot] = [first]
        for _ in range(BLOCK_MAX):  # one more than a block: a second block
            slot = await gate.take(_waiter())
            assert slot is not None and slot.pooled
            slots.append(slot)
        assert gate.blocks == 2 and len(await _held(rds)) == 2 * BLOCK_MAX
        for slot in slots:
            slot.done(10)
    finally:
        await gate.close()
        await limiter.close()
        await state.close()
    assert await _held(rds) == []


async def test_near_the_cap_each_request_takes_its_own_lease(rds: RedisServer) -> None:
    state, other_state = SharedState(rds.url), SharedState(rds.url)
    limiter, other = Limiter(state, fail_open=False), Limiter(other_state, fail_open=False)
    gate = Gate("engine", 16, limiter, None)
    try:
        busy = Bucket("queue:engine", "concurrent", 16)
        for _ in range(8):  # another process runs half the cap, one lease a request
            assert (await other.acquire([busy], 0)).allowed
        slot = await gate.take(_waiter())
        assert slot is not None and not slot.pooled and gate.blocks == 0 and gate.spare == []
        assert "/" not in slot.lease and slot.lease in await _held(rds)
        again = await gate.take(_waiter())  # the refused block is not asked for again at once
        assert again is not None and not again.pooled and gate.blocks == 0
        assert len(await _held(rds)) == 10
    finally:
        await gate.close()
        await limiter.close()
        await other.close()
        await state.close()
        await other_state.close()


async def test_a_block_held_by_a_dead_process_comes_back_when_its_leases_expire(rds: RedisServer) -> None:
    dead_state, live_state = SharedState(rds.url), SharedState(rds.url)
    dead = Limiter(dead_state, fail_open=False, lease_ttl_ms=1000)
    live = Limiter(live_state, fail_open=False, lease_ttl_ms=1000)
    gate = Gate("engine", 16, live, None)
    try:
        held = await Gate("engine", 16, dead, None).take(_waiter())
        assert held is not None and held.pooled
        await dead.close()  # the process dies: its block is neither given back nor renewed again
        assert len(await _held(rds)) == 2
        slots = [await gate.take(_waiter()) for _ in range(14)]
        assert all(s is not None for s in slots) and await gate.take(_waiter()) is None  # 14 + its 2
        w = _waiter()
        started = time.monotonic()
        gate.enqueue(w)
        last = await asyncio.wait_for(w.future, 10)
        assert 0.5 < time.monotonic() - started < 3.0  # about the lease's TTL
        for s in [*slots, last]:
            assert s is not None
            s.done(10)
    finally:
        await gate.close()
        await live.close()
        await dead_state.close()
        await live_state.close()


async def test_spare_leases_are_dropped_while_redis_does_not_answer(rds: RedisServer) -> None:
    state = SharedState(rds.url)
    limiter = Limiter(state, fail_open=False)
    gate = Gate("engine", 16, limiter, None)  # blocks of 2
    try:
        running = await gate.take(_waiter())
        spare = await gate.take(_waiter())
        assert running is not None and spare is not None and running.pooled and spare.pooled
        spare.done(10)
        assert len(gate.spare) == 1
        rds.stop()
        with contextlib.suppress(RedisDown):  # any call finds Redis away
            await limiter.acquire([Bucket("queue:other", "concurrent", 1)], 0)
        assert state.degraded
        await asyncio.sleep(TRIM_S * 1.5)
        assert gate.spare == []  # no request starts on a lease nobody renews
        running.done(10)
        assert gate.spare == [] and gate.pooled == 0  # nor on the one in use, once it ends
    finally:
        rds.start()
        await gate.close()
        await limiter.close()
        await state.close()


async def test_the_leases_of_a_block_are_written_again_after_a_redis_restart(redis: RedisServer) -> None:
    """A restarted Redis keeps nothing, but the process still uses its block's leases (one in use, one spare
    here, until a trim gives it back): they are written again as soon as Redis answers, so another process
    gets the rest of the cap and no more. Before, Redis never counted them again (their renewal only renewed
    leases it still had), and another process took the whole cap beside the running one: 17 requests on a
    server capped at 16, and more while the process kept handing out its spares."""
    state, other_state = SharedState(redis.url), SharedState(redis.url)
    limiter, other = Limiter(state, fail_open=False), Limiter(other_state, fail_open=False)
    gate = Gate("engine", 16, limiter, None)  # blocks of 2
    try:
        running = await gate.take(_waiter())
        assert running is not None and running.pooled and len(gate.spare) == 1
        redis.restart()
        deadline = time.monotonic() + 3
        while running.lease not in await _held(redis):
            assert time.monotonic() < deadline, "the block's leases were not written again"
            await asyncio.sleep(0.05)
        busy = Bucket("queue:engine", "concurrent", 16)
        taken = 0
        while taken <= 16 and (await other.acquire([busy], 0)).allowed:
            taken += 1
        # What this process runs or may hand out is counted in Redis again: the other process got the rest.
        assert taken + gate.in_use + len(gate.spare) == 16 and len(await _held(redis)) == 16
        running.done(10)
    finally:
        await gate.close()
        await limiter.close()
        await other.close()
        await state.close()
        await other_state.close()
