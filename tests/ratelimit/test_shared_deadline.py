"""`SharedState.run`'s deadline (twice the URL's `socket_timeout`) on a real redis-server: a reply that came
in time is taken even when the event loop, held busy past the deadline, reads it late; a Redis that does not
answer (frozen with SIGSTOP) is still taken for down at the deadline, held loop or not.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import uvloop

from gateway.state import Degraded, SharedState
from tests.helpers.loops import LOOPS, run_on
from tests.helpers.redis import RedisServer

TIMEOUT_S = 0.2  # the URL's socket_timeout: a call's deadline is twice it
HOLD_S = 5 * TIMEOUT_S  # how long another connection's callback holds the loop: well past the deadline
# Redis answers a BLPOP on an empty list when its timeout is up: a reply that comes, deterministically,
# half-way to redis-py's socket timeout and a quarter of the way to the call's deadline.
REPLY_AFTER_S = TIMEOUT_S / 2


class Busy:
    """Another connection whose I/O callback holds the loop (HOLD_S unless told) once poked."""

    def __init__(self, loop: asyncio.AbstractEventLoop, hold_s: float = HOLD_S) -> None:
        self.loop, self.hold_s = loop, hold_s
        self.ours, self.theirs = socket.socketpair()
        loop.add_reader(self.ours, self._work)

    def _work(self) -> None:
        self.ours.recv(1)
        time.sleep(self.hold_s)

    def poke_in(self, delay: float) -> None:
        self.loop.call_later(delay, self.theirs.send, b"x")

    def close(self) -> None:
        self.loop.remove_reader(self.ours)
        self.ours.close()
        self.theirs.close()


async def on_busy_loop(
    url: str, op: Callable[[Busy, SharedState], Awaitable[Any]], hold_s: float = HOLD_S
) -> tuple[object, bool]:
    """`op`'s result (or Degraded), and whether SharedState took Redis for down."""
    shared = SharedState(f"{url}?socket_timeout={TIMEOUT_S}")
    busy = Busy(asyncio.get_running_loop(), hold_s)
    try:
        result: object = await op(busy, shared)
    except Degraded:
        result = Degraded
    finally:
        busy.close()
        await shared.close()
    return result, shared.degraded


@pytest.mark.parametrize("make_loop", LOOPS.values(), ids=LOOPS.keys())
def test_a_reply_that_came_in_time_while_the_loop_was_busy_is_taken(
    rds: RedisServer, make_loop: Callable[[], asyncio.AbstractEventLoop]
) -> None:
    """The loop is held in another connection's I/O callback while the reply comes; when it is free again its
    timers are due (uvloop runs them before it polls its sockets; asyncio reads the socket first but cancels
    the call before it runs): the reply, in the socket since long before the deadline, must still be taken."""

    async def op(busy: Busy, shared: SharedState) -> object:
        assert await shared.run(lambda r: r.ping()) is True  # connected
        busy.poke_in(REPLY_AFTER_S / 2)  # the loop is held from before the reply comes until past the deadline
        return await shared.run(lambda r: r.blpop(["empty"], timeout=REPLY_AFTER_S))

    assert run_on(make_loop, on_busy_loop(rds.url, op)) == (None, False)


@pytest.mark.parametrize("make_loop", LOOPS.values(), ids=LOOPS.keys())
def test_a_connection_made_while_the_loop_was_busy_is_taken(
    rds: RedisServer, make_loop: Callable[[], asyncio.AbstractEventLoop]
) -> None:
    """A new connection (the pool grows in a burst) completes while the loop is held past the socket timeout
    but not past the call's deadline: the connection, its handshake and the call go through in what is left.
    (Held past the deadline, the handshake's round trips, not yet sent, cannot have been answered in time.)"""

    async def op(busy: Busy, shared: SharedState) -> object:
        busy.poke_in(0)
        return await shared.run(lambda r: r.ping())

    assert run_on(make_loop, on_busy_loop(rds.url, op, hold_s=1.5 * TIMEOUT_S)) == (True, False)


@pytest.mark.parametrize("held", [False, True], ids=["idle-loop", "busy-loop"])
def test_a_frozen_redis_is_taken_for_down_at_the_deadline(rds: RedisServer, held: bool) -> None:
    async def main() -> tuple[float, bool]:
        shared = SharedState(f"{rds.url}?socket_timeout={TIMEOUT_S}")
        busy = Busy(asyncio.get_running_loop())
        try:
            assert await shared.run(lambda r: r.ping()) is True  # connected: the stall is a read's
            os.kill(rds.proc.pid, signal.SIGSTOP)
            try:
                if held:
                    busy.poke_in(TIMEOUT_S / 2)
                started = time.monotonic()
                with pytest.raises(Degraded):
                    await shared.run(lambda r: r.ping())
                waited = time.monotonic() - started
            finally:
                os.kill(rds.proc.pid, signal.SIGCONT)
            return waited, shared.degraded
        finally:
            busy.close()
            await shared.close()

    waited, degraded = run_on(uvloop.new_event_loop, main())
    assert degraded
    assert waited < (HOLD_S if held else 2 * TIMEOUT_S) + 0.5


def test_a_redis_that_refuses_connections_is_taken_for_down_at_once() -> None:
    """Connecting is bounded by the call's deadline, not by a timer of the client's own: a refused
    connection still fails the call at once."""

    async def main() -> tuple[float, bool]:
        with socket.socket() as unused:
            unused.bind(("127.0.0.1", 0))
            port = unused.getsockname()[1]
        shared = SharedState(f"redis://127.0.0.1:{port}/0?socket_timeout={TIMEOUT_S}")
        try:
            started = time.monotonic()
            with pytest.raises(Degraded):
                await shared.run(lambda r: r.ping())
            return time.monotonic() - started, shared.degraded
        finally:
            await shared.close()

    waited, degraded = run_on(uvloop.new_event_loop, main())
    assert degraded and waited < TIMEOUT_S
