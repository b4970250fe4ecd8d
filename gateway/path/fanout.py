"""Opening an emulation's sub-streams together, for completion and chat attempts alike."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, Protocol, TypeVar


class Closable(Protocol):
    """What open_all closes when a sibling failed: a stream already opened."""

    async def close(self) -> None: ...


OpenT = TypeVar("OpenT", bound=Closable)


async def open_all(calls: list[Coroutine[Any, Any, OpenT]]) -> list[OpenT]:
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
