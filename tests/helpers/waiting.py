"""Polling for what happens off the request path (bookings, settlements, a peer hanging up)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any


async def wait_for(event: threading.Event, timeout: float) -> bool:
    """Wait on a thread event from the upstream's loop without blocking it (and stay cancellable)."""
    deadline = time.monotonic() + timeout
    while not event.is_set():
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(0.005)
    return True


def wait_until(predicate: Any, timeout: float = 5.0, interval: float = 0.01) -> None:
    """Poll `predicate()` until it is truthy (background settlement is off the request path)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(interval)
