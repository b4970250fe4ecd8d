"""A usage view (the day's usage, the status page's spend per day) asked while the writer holds a batch it
has taken but not committed counts that batch's rows once: not missed (they are no longer in the queue
the view copies, and not yet in the database), and not twice (rows still in the queue when the view is
asked, committed by a later turn before the view's query ends).

The writer's thread is held on purpose with a job of its own (`behind_writer`, a real thread and a real
SQLite file), so the batch stays taken and uncommitted for as long as the test needs.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import uvloop

from gateway.config import LedgerConfig
from gateway.ledger.book import Ledger
from gateway.ledger.report import day_usage, spend_per_day
from gateway.limits.usage import day_of
from gateway.ops.metrics import Record


def _record(i: int) -> Record:
    rec = Record(request_id=f"r-{i}", dialect="openai", key="alice", model="fast", provider="demo", target="demo/x")
    rec.attempts = 1
    return rec


def test_a_view_counts_a_batch_being_committed_once(tmp_path: Path) -> None:
    async def run() -> None:
        # flush_ms far away: only the test's own `flush` calls take batches from the queue.
        cfg = LedgerConfig(url=f"sqlite:///{tmp_path / 'ledger.db'}", spill_dir=str(tmp_path), flush_ms=60_000)
        ledger = Ledger(cfg)
        await ledger.start()
        try:
            day = day_of(time.time())
            for i in range(5):
                ledger.append(_record(i), 0.01)
            release = threading.Event()
            held = ledger.behind_writer(lambda _cur: release.wait(10))  # the writer's thread, busy until released
            taking = asyncio.ensure_future(ledger.flush())
            await asyncio.sleep(0)  # the flush takes the five rows and hands their batch to the held thread
            assert not ledger.queue
            for i in range(5, 8):
                ledger.append(_record(i), 0.01)  # still waiting when the view is asked
            view = asyncio.ensure_future(day_usage(ledger, day, {}))
            chart = asyncio.ensure_future(spend_per_day(ledger, 30))
            await asyncio.sleep(0)  # each view copies the queue (three rows) and asks behind the batch
            later = asyncio.ensure_future(ledger.flush())  # the three rows are committed after the view's query
            await asyncio.sleep(0)
            release.set()
            assert await held is True
            await taking
            await later
            usage = await view
            assert usage["keys"]["alice"]["by_model"]["fast"]["requests"] == 8
            spend = await chart
            assert spend is not None and spend[-1] == {"day": day, "cost": 0.0, "requests": 8}
            # Afterwards, everything is committed and the view reads it all from the database.
            assert not ledger.queue and ledger.booked == 8
            assert (await day_usage(ledger, day, {}))["keys"]["alice"]["requests"] == 8
        finally:
            await ledger.close()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(run())
