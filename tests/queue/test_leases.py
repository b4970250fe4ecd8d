"""With Redis, a slot is a concurrency lease: one a process held when it died comes back when the lease
expires, and a process waiting for it gets it then."""

from __future__ import annotations

import asyncio
import time

from gateway.limits.ratelimit import Limiter
from gateway.queue.fair import Waiter
from gateway.queue.gate import Gate
from gateway.state import SharedState
from tests.helpers.redis import RedisServer


def _waiter() -> Waiter:
    return Waiter("tenant", 1.0, 1, 10, asyncio.get_running_loop().create_future(), time.monotonic())


async def test_a_slot_held_by_a_dead_process_comes_back_when_its_lease_expires(rds: RedisServer) -> None:
    dead_state, live_state = SharedState(rds.url), SharedState(rds.url)
    dead = Limiter(dead_state, fail_open=False, lease_ttl_ms=1000)
    live = Limiter(live_state, fail_open=False, lease_ttl_ms=1000)
    try:
        held = await Gate("engine", 1, dead, None).take(_waiter())
        assert held is not None
        await dead.close()  # the process dies: its lease is neither released nor renewed again
        gate = Gate("engine", 1, live, None)
        assert await gate.take(_waiter()) is None  # the cap holds across processes
        w = _waiter()
        started = time.monotonic()
        gate.enqueue(w)
        slot = await asyncio.wait_for(w.future, 10)
        waited = time.monotonic() - started
        assert 0.5 < waited < 3.0  # about the lease's TTL
        slot.done(12)
        assert gate.in_use == 0
        await asyncio.sleep(0.05)  # the release reaches Redis off the request path
        again = await gate.take(_waiter())
        assert again is not None
        again.done(0)
    finally:
        await live.close()
        await dead_state.close()
        await live_state.close()
