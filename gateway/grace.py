"""A wait whose time is up is failed only after the event loop has read its sockets once more (`Grace`):
the one rule behind the Redis calls' deadline (`state.Deadline`), the h1 client's `Watchdog`, the
rate-limit channel's watchdog and the server's keep-alive and head timeouts (gateway/server/h1.py).

A loop held busy past a due time (a burst of callbacks, a slow request) finds its timers due when it is
free again and runs them before it reads the sockets that became ready meanwhile (uvloop); asyncio reads
first, but runs the timer before what that read woke. Either way a reply that came in time would be taken
for the peer timing out, and the gateway's own lag for the peer failing. A peer that does not answer still
fails the wait, a few loop passes late.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Final

# Loop passes between a due timer and the verdict: the first runs before the loop's next poll of its
# sockets, the second after it.
PASSES: Final = 2


class Grace:
    """`callback(*args)`, PASSES loop passes after the timer (or callback) that creates it, unless cancelled.

    Made only where a timer found its wait due, and kept where that timer's handle was (`cancel` as a
    handle's): by the second pass the loop has polled its sockets, and what the poll read has reached its
    protocol. The callback decides again whether the wait is still unanswered. A future that the poll
    resolved still has its own callbacks to run (a task to wake): a caller that needs those run too waits
    one pass more (`state.Deadline`, through its timeout's `reschedule`).
    """

    __slots__ = ("_loop", "_callback", "_args", "_left", "_handle")

    def __init__(self, loop: asyncio.AbstractEventLoop, callback: Callable[..., object], *args: Any) -> None:
        self._loop = loop
        self._callback = callback
        self._args = args
        self._left = PASSES - 1
        self._handle: asyncio.Handle | None = loop.call_soon(self._pass)

    def _pass(self) -> None:
        if self._left:
            # Scheduled from a callback: it runs in the loop's next pass, after that pass's poll.
            self._left -= 1
            self._handle = self._loop.call_soon(self._pass)
        else:
            self._handle = None
            self._callback(*self._args)

    def cancel(self) -> None:
        handle = self._handle
        if handle is not None:
            handle.cancel()
            self._handle = None
