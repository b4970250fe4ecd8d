"""Another process's spill file is looked for on a schedule, not on every batch: a busy writer lists the
spill directory at its first turn (and then once a minute), never once per batch, and a dead process's file
is replayed at the next listing; one whose replay an outage interrupted is looked for again once the
database answers, and none of its rows is lost."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections import deque
from pathlib import Path
from typing import Any

import pytest

from gateway.config import LedgerConfig
from gateway.ledger.batch import Pending, pending, take
from gateway.ledger.book import Ledger
from gateway.ops.metrics import Record
from tests.helpers.postgres import PostgresServer
from wire.schema import Usage

from .conftest import COST_PICO, query

TS = 1_795_800_000.0


def _pending(start: int, count: int) -> deque[Pending]:
    out: deque[Pending] = deque()
    for i in range(start, start + count):
        rec = Record(request_id=f"r-{i}", dialect="openai", key="alice", model="fast", provider="demo")
        rec.usage = Usage(prompt_tokens=3, completion_tokens=7, total_tokens=10)
        rec.attempts, rec.cost_pico = 1, COST_PICO
        out.append(pending(rec, 0.1, TS + i, None))
    return out


def _queue(ledger: Ledger, start: int, count: int) -> None:
    ledger.queue.extend(_pending(start, count))


def _dead_file(spill: Path, first: int) -> None:
    """A spill file of a process that died: nobody holds its lock. Rows of this gateway's own layout."""
    rows = take(_pending(first, 3), f"dead{first}", itertools.count()).full()
    (spill / f"ledger-spill-1-dead{first}.jsonl").write_text(json.dumps([list(r) for r in rows]) + "\n")


def _ids(url: str) -> list[str]:
    return [r[0] for r in query(url, "SELECT request_id FROM requests ORDER BY request_id")]


def test_a_busy_writer_does_not_list_the_spill_directory_per_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    spill = tmp_path / "spill"
    spill.mkdir()
    listings: list[str] = []
    glob = Path.glob

    def counted(self: Path, pattern: str, *args: Any, **kwargs: Any) -> Any:
        if self == spill:
            listings.append(pattern)
        return glob(self, pattern, *args, **kwargs)

    monkeypatch.setattr(Path, "glob", counted)

    async def run() -> None:
        ledger = Ledger(LedgerConfig(url=url, spill_dir=str(spill)))
        await ledger.start()
        await ledger.flush()  # the first turn looks
        assert len(listings) == 1
        _dead_file(spill, 900)  # a process dies after that look
        for turn in range(20):
            _queue(ledger, turn * 10, 10)
            await ledger.flush()
        assert len(listings) == 1, listings  # 20 batches booked, no listing among them
        assert len(_ids(url)) == 200 and (spill / "ledger-spill-1-dead900.jsonl").exists()
        ledger._orphans_at = 0.0  # the minute has passed
        await ledger.flush()
        assert not (spill / "ledger-spill-1-dead900.jsonl").exists()
        await ledger.close()

    asyncio.run(run())
    ids = _ids(url)
    assert len(ids) == 203 and {"r-900", "r-901", "r-902"} <= set(ids)


def test_an_interrupted_replay_is_looked_for_again_once_the_database_answers(
    pg: PostgresServer, tmp_path: Path
) -> None:
    spill = tmp_path / "spill"
    spill.mkdir()
    _dead_file(spill, 500)

    async def run() -> None:
        ledger = Ledger(LedgerConfig(url=pg.url, spill_dir=str(spill), timeout_ms=1000))
        await ledger.start()
        pg.stop()
        await ledger.flush()  # the dead file is found, its replay fails: the database is down
        assert ledger.down is not None and (spill / "ledger-spill-1-dead500.jsonl").exists()
        pg.start()
        _queue(ledger, 0, 5)
        await ledger.flush()  # this turn's rows are booked and the outage is over
        assert ledger.down is None
        await ledger.flush()  # the next turn looks again, without waiting for the minute
        assert not (spill / "ledger-spill-1-dead500.jsonl").exists()
        await ledger.close()

    asyncio.run(run())
    assert _ids(pg.url) == sorted(["r-500", "r-501", "r-502", *(f"r-{i}" for i in range(5))])
