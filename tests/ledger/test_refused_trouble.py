"""Rows the database refuses are kept in the refused-rows file; when that file cannot take them (a disk full, a
path that cannot be written) they are counted (`gateway_ledger_refused_lost_rows`) and said once, with the
cause, until the file takes rows again. On a real PostgreSQL, whose text cannot hold a NUL."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from gateway.config.loading import parse_config
from gateway.ledger.book import Ledger
from gateway.ledger.service import LedgerService
from gateway.ops.metrics import Metrics
from tests.helpers.postgres import PostgresServer

from .conftest import ENV, config, totals
from .test_hostile_rows import _queue


def test_refused_rows_the_refused_file_cannot_take_are_counted_and_said_once(
    pg: PostgresServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spill = tmp_path / "spill"
    caplog.set_level(logging.INFO, logger="gateway")
    metrics = Metrics()
    service = LedgerService(parse_config(config(pg.url, extra=f', spill_dir: "{spill}"'), env=ENV), metrics)

    async def run() -> Ledger:
        ledger = service.ledger
        await ledger.start()
        ledger.rejects.path.mkdir(parents=True)  # where the refused rows would go: a directory, not writable
        for turn in range(3):
            _queue(ledger, 4, turn * 10)
            await ledger.flush()
        assert (ledger.booked, ledger.refused) == (12, 3)
        ledger.rejects.path.rmdir()  # the file can be written again
        _queue(ledger, 4, 100)
        await ledger.flush()
        await ledger.close()
        return ledger

    ledger = asyncio.run(run())
    assert ledger.rejects.path.is_file()
    assert metrics.registry.get_sample_value("gateway_ledger_refused_lost_rows") == 3
    said = [r.getMessage() for r in caplog.records if "refused-rows file" in r.getMessage()]
    assert len(said) == 2, said  # once when the file first fails, once when it takes rows again
    assert "cannot be written (IsADirectoryError" in said[0] and "(1 so far)" in said[0], said
    assert said[1].startswith("ledger: the refused-rows file takes rows again; 3 refused row(s) lost"), said
    rows, rolled = totals(pg.url)
    assert rows == rolled and rows[0] == 16
    # No line claims the lost rows were kept.
    kept = [r.getMessage() for r in caplog.records if "kept in" in r.getMessage()]
    assert len(kept) == 1, kept
