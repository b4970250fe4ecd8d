"""`Grace` on real event loops (asyncio and uvloop): a timer that finds its wait due while the loop was held
busy, with the reply already in the socket, still sees the reply by the verdict; a silent peer is still
failed, a couple of loop passes late; a cancelled grace never gives its verdict.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable

import pytest
import uvloop

from gateway.grace import PASSES, Grace
from tests.helpers.loops import LOOPS, run_on

DUE_S = 0.05  # the wait's timer
HOLD_S = 0.3  # another connection's callback holds the loop from before the reply until well past DUE_S


class Reader(asyncio.Protocol):
    def __init__(self) -> None:
        self.got = b""

    def data_received(self, data: bytes) -> None:
        self.got += data


async def held_past_due(reply: bool) -> tuple[bytes, bytes, float]:
    """What the wait's protocol had read when its timer fired, and at the grace's verdict; and how long after
    the hold ended the verdict came. The peer answers (if `reply`) while the loop is held, before the due time."""
    loop = asyncio.get_running_loop()
    ours, peer = socket.socketpair()
    busy, poke = socket.socketpair()
    transport, proto = await loop.connect_accepted_socket(Reader, ours)
    held_until = 0.0

    def other_work() -> None:  # another connection's I/O callback
        nonlocal held_until
        busy.recv(1)
        if reply:
            peer.send(b"reply")
        time.sleep(HOLD_S)
        held_until = time.monotonic()

    at_timer: list[bytes] = []
    verdict: asyncio.Future[bytes] = loop.create_future()

    def due() -> None:
        at_timer.append(proto.got)
        Grace(loop, lambda: verdict.set_result(proto.got))

    loop.add_reader(busy, other_work)
    try:
        loop.call_later(DUE_S, due)
        poke.send(b"x")
        got = await verdict
        return at_timer[0], got, time.monotonic() - held_until
    finally:
        loop.remove_reader(busy)
        transport.close()
        for s in (peer, busy, poke):
            s.close()


@pytest.mark.parametrize("make_loop", LOOPS.values(), ids=LOOPS.keys())
def test_a_reply_in_the_socket_while_the_loop_was_held_is_read_by_the_verdict(
    make_loop: Callable[[], asyncio.AbstractEventLoop],
) -> None:
    at_timer, verdict, _ = run_on(make_loop, held_past_due(reply=True))
    assert verdict == b"reply"
    if make_loop is uvloop.new_event_loop:
        # Not vacuous: uvloop runs the due timer before it reads the socket; a plain timer would miss the reply.
        assert at_timer == b""


@pytest.mark.parametrize("make_loop", LOOPS.values(), ids=LOOPS.keys())
def test_a_silent_peer_still_fails_as_soon_as_the_loop_is_free(
    make_loop: Callable[[], asyncio.AbstractEventLoop],
) -> None:
    at_timer, verdict, after_hold_s = run_on(make_loop, held_past_due(reply=False))
    assert (at_timer, verdict) == (b"", b"")
    assert after_hold_s < 0.1


@pytest.mark.parametrize("make_loop", LOOPS.values(), ids=LOOPS.keys())
def test_the_verdict_comes_on_the_second_loop_pass(make_loop: Callable[[], asyncio.AbstractEventLoop]) -> None:
    """Passes counted by a callback chain started alongside: the verdict runs after one link, before the next."""

    async def main() -> int:
        loop = asyncio.get_running_loop()
        ticks = 0
        verdict: asyncio.Future[int] = loop.create_future()

        def tick() -> None:
            nonlocal ticks
            ticks += 1
            if ticks < 5:
                loop.call_soon(tick)

        def start() -> None:
            Grace(loop, lambda: verdict.set_result(ticks))
            loop.call_soon(tick)

        loop.call_soon(start)
        return await verdict

    assert PASSES == 2
    assert run_on(make_loop, main()) == PASSES - 1


@pytest.mark.parametrize("make_loop", LOOPS.values(), ids=LOOPS.keys())
@pytest.mark.parametrize("cancel_after", [0, 1], ids=["at-once", "between-passes"])
def test_a_cancelled_grace_gives_no_verdict(
    make_loop: Callable[[], asyncio.AbstractEventLoop], cancel_after: int
) -> None:
    async def main() -> list[str]:
        loop = asyncio.get_running_loop()
        called: list[str] = []
        grace = Grace(loop, called.append, "verdict")
        if cancel_after:
            loop.call_soon(grace.cancel)  # runs after the first pass, before the second
        else:
            grace.cancel()
        await asyncio.sleep(0.02)
        grace.cancel()  # a second cancel, like a handle's, is harmless
        done = Grace(loop, called.append, "later")
        await asyncio.sleep(0.02)
        done.cancel()  # and so is one after the verdict
        return called

    assert run_on(make_loop, main()) == ["later"]
