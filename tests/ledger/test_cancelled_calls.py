"""A ledger call that is cancelled ends cancelled, even when its answer arrives in the very step the
cancellation does.

`asyncio.wait_for` (Python 3.11) returns the answer in that case and drops the cancellation; a background
loop stopped by cancelling it (the keys' poller, say) then runs on, and the gateway's shutdown waits for it
forever. The race is made here on purpose: the ledger's own thread schedules the cancellation just before it
answers, so both reach the event loop in one step.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest
import uvloop

from gateway.config import LedgerConfig
from gateway.ledger.book import Ledger


def test_a_call_cancelled_as_it_answers_ends_cancelled(tmp_path: Path) -> None:
    async def run() -> None:
        ledger = Ledger(LedgerConfig(url=f"sqlite:///{tmp_path / 'ledger.db'}", spill_dir=str(tmp_path)))
        await ledger.start()
        loop = asyncio.get_running_loop()
        caller: list[asyncio.Task[None]] = []  # the task to cancel as the ledger's thread answers it

        def answer_and_cancel() -> str:
            assert threading.current_thread() is not threading.main_thread()
            loop.call_soon_threadsafe(caller[-1].cancel)
            return "answer"

        async def once() -> None:
            await ledger.call(answer_and_cancel)

        caller.append(asyncio.ensure_future(once()))
        with pytest.raises(asyncio.CancelledError):
            await caller[-1]
        # A loop that is cancelled while it waits for the ledger stops: what the keys' poller and every
        # background reader rely on at shutdown.
        rounds = 0

        async def poll() -> None:
            nonlocal rounds
            while True:
                rounds += 1
                await ledger.call(answer_and_cancel)

        poller = asyncio.ensure_future(poll())
        caller.append(poller)
        done, _ = await asyncio.wait([poller], timeout=5)
        assert done == {poller} and poller.cancelled() and rounds == 1
        await ledger.close()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(run())
