"""A process that starts while the database takes no writes counts the rows of the spill files dead processes
left (it lists them for replay anyway) in its views and budgets, as it counts its own spilled rows: a restart
during an outage does not make the totals dip until the files are replayed. On a SQLite file another writer
holds."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

from gateway.config import LedgerConfig
from gateway.ledger.book import Ledger
from gateway.limits.usage import day_of

from .test_spill_trouble import _away, _rows


def _left_file(spill: Path, n: int) -> None:
    """A spill file of a process that died: `n` rows of today, one cent each."""
    day = day_of(time.time())
    rows = [
        [f"dead-{i}", f"req-{i}", time.time(), day, "alice", "blue", "fast", "demo/long", "demo", "openai", 0, 200]
        + [None, 1.0, 1.0, 3, 7, 10**10, None, 1, None, None, "", None, "completions"]
        for i in range(n)
    ]
    spill.mkdir(parents=True, exist_ok=True)
    (spill / "ledger-spill-1-000000000000.jsonl").write_bytes(msgspec.json.encode(rows) + b"\n")


def test_spill_files_left_by_a_dead_process_count_until_replayed(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    spill = tmp_path / "spill"
    _left_file(spill, 4)

    def booked(cur: Any) -> int:
        return int(cur.rows("SELECT coalesce(sum(requests), 0) FROM daily")[0][0])

    async def total(ledger: Ledger) -> int:
        held, waiting = await ledger.read(booked)
        return int(held) + sum(v[0] for v in waiting.values())

    async def run() -> None:
        ledger = Ledger(LedgerConfig(url=url, timeout_ms=200, spill_dir=str(spill)))
        await ledger.start()
        try:
            with _away("sqlite", url, request):
                _rows(ledger, 2)
                await ledger.flush()  # the first turn: the left file cannot be replayed, nor these rows booked
                assert ledger.down is not None and ledger.spilling == 1
                assert await total(ledger) == 6
            for _ in range(3):  # the database answers: own rows, then the left file, are booked
                _rows(ledger, 1)
                await ledger.flush()
            assert not (spill / "ledger-spill-1-000000000000.jsonl").exists()
            assert await total(ledger) == 9
            assert ledger.orphaned == {}
        finally:
            await ledger.close()

    asyncio.run(run())


def test_a_left_file_another_process_replays_stops_counting(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """The left file is replayed by another replica once the database answers: this process stops counting it
    at its next look at the directory, and counts its rows once, as booked."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    spill = tmp_path / "spill"
    _left_file(spill, 4)

    def booked(cur: Any) -> int:
        return int(cur.rows("SELECT coalesce(sum(requests), 0) FROM daily")[0][0])

    async def total(ledger: Ledger) -> int:
        held, waiting = await ledger.read(booked)
        return int(held) + sum(v[0] for v in waiting.values())

    async def run() -> None:
        ledger = Ledger(LedgerConfig(url=url, timeout_ms=200, spill_dir=str(spill)))
        other = Ledger(LedgerConfig(url=url, timeout_ms=200, spill_dir=str(spill)))
        await ledger.start()
        await other.start()
        try:
            with _away("sqlite", url, request):
                _rows(ledger, 2)
                await ledger.flush()
                assert await total(ledger) == 6
            # This process's own rows are booked; the other replays the left file first.
            _rows(ledger, 1)
            await ledger.flush()
            await other.flush()
            assert not (spill / "ledger-spill-1-000000000000.jsonl").exists()
            for _ in range(2):
                _rows(ledger, 1)
                await ledger.flush()
            assert ledger.orphaned == {}
            assert await total(ledger) == 9
        finally:
            await other.close()
            await ledger.close()

    asyncio.run(run())
