"""A hedged stream whose client leaves (its request cancelled) at the worst moments: every attempt's in-flight
count goes back to 0 and every upstream stream it opened is closed, the answer that won included.

The cancel is made as the endpoint makes it when its client disconnects (the request's task cancelled), at a
loop turn the test picks by watching the attempts' own tasks: the turn an attempt finishes with an answer,
before the failover loop has read it; and with Redis, while a count's shared write is on the wire.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from gateway.path.pipeline import Pipeline
from tests.helpers.faults import FaultServer, gated, stream
from tests.helpers.pipelines import VirtualTime, ask, key
from tests.helpers.redis import RedisServer
from tests.helpers.waiting import wait_for

from .conftest import MakePipeline

BUSY = """
  - name: smart
    strategy: least-busy
    hedge_after_ms: {hedge}
    targets: [{{model: alpha/davinci-002}}, {{model: beta/davinci-002}}]
"""
TOP = "retries: {attempts: 3}\ntimeouts: {connect_ms: 1000, first_byte_ms: 5000, total_ms: 8000}\n"


class Attempts:
    """The upstream attempts of the requests in flight, as the tasks a hedge runs them in."""

    def __init__(self) -> None:
        self.tasks: set[asyncio.Task[Any]] = set()

    def look(self) -> None:
        for task in asyncio.all_tasks():
            if getattr(task.get_coro(), "__qualname__", "") == "Run.attempt":
                self.tasks.add(task)

    def answered(self) -> list[asyncio.Task[Any]]:
        return [t for t in self.tasks if t.done() and not t.cancelled() and t.exception() is None]


async def cancel_when(request: asyncio.Future[Any], ready: Callable[[], bool]) -> None:
    """Cancel `request` (its client left) in the first loop turn `ready()` holds, checked on every turn."""
    while not ready():
        assert not request.done(), "the request ended before the moment to cancel it came"
        await asyncio.sleep(0)
    request.cancel()
    with pytest.raises(asyncio.CancelledError):
        await request


async def let_go(p: Pipeline, faults: FaultServer, *providers: str) -> None:
    """Every count back at 0 (local: a shared write the cancel cut is left to its TTL) and every stream closed."""
    for provider in providers:
        assert await wait_for(faults[provider].hits[0].disconnected, 2.0), f"{provider}'s stream left open"
    await asyncio.sleep(0.05)  # a cancelled attempt gives its count back on its own next turn
    assert p.health.local.inflight == {}


@pytest.mark.parametrize("winner", ["alpha", "beta"])
async def test_a_client_that_leaves_as_an_attempt_answers_leaves_nothing_held(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime, winner: str
) -> None:
    # alpha: its first event before the hedge starts; beta: the hedge's, while alpha says nothing. The stream
    # that answered stays open upstream (an event every 0.5 s): only the gateway can close it. The hedge waits
    # in wall-clock time, so alpha's is far longer than a loaded machine takes to connect and answer (a CI run
    # once took over 2 s); it costs nothing when alpha answers, since the request ends with its answer.
    if winner == "alpha":
        faults["alpha"].script(stream(gap=0.5))
        p = make(BUSY.format(hedge=4000), top=TOP)
    else:
        faults["alpha"].script(stream(first_delay=3.0))
        faults["beta"].script(stream(gap=0.5))
        p = make(BUSY.format(hedge=100), top=TOP)
    attempts = Attempts()

    def answered() -> bool:
        attempts.look()
        return bool(attempts.answered())

    await cancel_when(asyncio.ensure_future(ask(p, stream=True)), answered)
    assert faults.order() == (["alpha"] if winner == "alpha" else ["alpha", "beta"])
    await let_go(p, faults, *faults.order())


async def test_a_cancel_during_the_shared_count_of_an_attempt_gives_it_back(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime, rds: RedisServer
) -> None:
    top = f"redis: {{url: '{rds.url}', refresh_ms: 0}}\n" + TOP
    p = make(BUSY.format(hedge=100), top=top)
    assert (await ask(p)).served_by == key("alpha")  # Redis's connection made: the next write waits on Redis alone
    faults.forget()
    faults["alpha"].script(stream(first_delay=3.0))
    # The count is taken locally before its write to Redis: the attempt is waiting on that write now.
    await cancel_when(asyncio.ensure_future(ask(p, stream=True)), lambda: bool(p.health.local.inflight))
    assert faults.order() == []  # cancelled before its call was made
    await asyncio.sleep(0.2)
    assert p.health.local.inflight == {}
    assert not p.shared.degraded


async def test_a_cancel_while_the_loser_gives_its_count_back_lets_go_of_the_winner(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime, rds: RedisServer
) -> None:
    # Both attempts answer in the same loop turn: one wins, and the other's count is given back, locally and
    # then in Redis. The client leaves during that write: the winner's stream must not be left open and counted.
    top = f"redis: {{url: '{rds.url}', refresh_ms: 0}}\n" + TOP
    p = make(BUSY.format(hedge=100), top=top)
    assert (await ask(p)).served_by == key("alpha")
    faults.forget()
    # Neither says a thing (not even its status line) until the loop is held, so both are read alike after:
    # both wait for `go`, which the test sets once beta's call (the hedge) is out and the loop is held; the
    # hold lasts until both first events are written, however late the upstream's thread comes to write them
    # (a full run's collector can stop it for a while). A delay in place of `go` can let beta's status line in
    # before the hold on a loaded machine, and beta then wins a turn ahead of alpha.
    written = {name: threading.Event() for name in ("alpha", "beta")}
    go = threading.Event()
    faults["alpha"].script(gated(go, stream(gap=0.5, written=written["alpha"])))
    faults["beta"].script(gated(go, stream(gap=0.5, written=written["beta"])))
    attempts = Attempts()
    counts: list[int] = []
    held: list[bool] = []

    def one_given_back() -> bool:
        attempts.look()
        if faults["beta"].count and not held:
            # The hedge was sent: hold the gateway's loop until both first events are in its sockets.
            go.set()
            for name, event in written.items():
                assert event.wait(10.0), f"{name} never wrote its first event"
            time.sleep(0.05)  # loopback hands them over at once; a moment's margin all the same
            held.append(True)
        counts.append(sum(p.health.local.inflight.values()))
        return counts[-1] == 1 and 2 in counts

    await cancel_when(asyncio.ensure_future(ask(p, stream=True)), one_given_back)
    assert len(attempts.answered()) == 2  # both answered: neither was cancelled as a loser still running
    await let_go(p, faults, "alpha", "beta")
    assert not p.shared.degraded
