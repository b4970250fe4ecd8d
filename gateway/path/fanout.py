"""Opening an emulation's sub-streams together, for completion and chat attempts alike."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gateway.path.attempt import Opened


async def open_all(calls: list[Coroutine[Any, Any, Opened]]) -> list[Opened]:
    """Open the sub-streams at once; if one fails, the others are cancelled, or closed if already open."""
    tasks = [asyncio.ensure_future(c) for c in calls]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for t in tasks:
            t.cancel()
        for r in await asyncio.gather(*tasks, return_exceptions=True):
            if not isinstance(r, BaseException):
                await r.close()
        raise
