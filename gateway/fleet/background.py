"""The one background task a fleet reader runs per pipeline: started once, cancelled and awaited on stop."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any


class Background:
    """Holds at most one task; `stop` cancels it and waits, so a retired pipeline leaves nothing running."""

    def __init__(self) -> None:
        self._task: asyncio.Task[None] | None = None

    def _spawn(self, run: Coroutine[Any, Any, None], name: str) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(run, name=name)
        else:
            run.close()

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
