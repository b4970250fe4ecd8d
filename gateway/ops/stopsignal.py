"""The moment this process is told to stop (SIGTERM, SIGINT), for work the server's own drain does not see.

The server stops accepting at the signal and gives the requests in flight `server.shutdown_grace_ms`; only
then does it run the app's shutdown. Work of the gateway's own that is not a request (the batch runner's
lines) must stop taking more at the signal too, and end within the same grace, not one more after it.
`on_stop` chains a callback before the server's handler, where that handler is a Python one (uvicorn's).
"""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def on_stop(callback: Callable[[], None]) -> Callable[[], None]:
    """Have the running loop call `callback` when a stop signal comes, then pass the signal on; the function
    that undoes it. Nothing is chained where the process has no Python handler of its own for a signal (the
    default, or a server that takes signals outside Python) or off the main thread (servers in tests)."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    loop = asyncio.get_running_loop()
    chained: dict[int, tuple[Callable[..., Any], Callable[..., Any]]] = {}
    for sig in _SIGNALS:
        previous = signal.getsignal(sig)
        if not callable(previous):
            continue

        def handler(signum: int, frame: FrameType | None, previous: Callable[..., Any] = previous) -> None:
            # A signal handler runs between two bytecodes of whatever the loop was doing: the callback runs
            # as the loop's next callback instead, where it may touch the loop's state.
            loop.call_soon_threadsafe(callback)
            previous(signum, frame)

        signal.signal(sig, handler)
        chained[sig] = (handler, previous)

    def undo() -> None:
        for sig, (handler, previous) in chained.items():
            if signal.getsignal(sig) is handler:
                signal.signal(sig, previous)

    return undo


__all__ = ["on_stop"]
