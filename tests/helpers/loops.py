"""Both event loops the gateway runs on, for tests whose subject is how a loop schedules its work."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import uvloop

LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "uvloop": uvloop.new_event_loop,
    "asyncio": asyncio.new_event_loop,
}


def run_on(make_loop: Callable[[], asyncio.AbstractEventLoop], main: Awaitable[Any]) -> Any:
    """`main` run to completion on a loop of its own, closed after."""
    loop = make_loop()
    try:
        return loop.run_until_complete(main)
    finally:
        loop.close()
