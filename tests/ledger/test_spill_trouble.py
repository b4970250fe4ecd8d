"""While the database cannot be written, rows the spill file cannot take (full, or a directory that cannot be
made) are counted and said once per outage, never a failed writer turn; once the database answers, one line
says how many the outage lost. On a SQLite file locked by another writer and on a stopped PostgreSQL."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.config import LedgerConfig
from gateway.ledger.batch import pending
from gateway.ledger.book import Ledger
from gateway.ops.metrics import Record
from tests.helpers.servers import cli_env, run_cli

from .conftest import ENV, config, query

TURNS = 4
ROWS = 30  # per turn: more than 4096 bytes, the smallest spill file


def _rows(ledger: Ledger, n: int) -> None:
    for i in range(n):
        rec = Record(
            request_id=f"r{i}", dialect="openai", key="alice", model="fast", provider="demo", target="demo/long"
        )
        rec.team, rec.cost_pico = "blue", 1000
        ledger.queue.append(pending(rec, 0.01, 1_795_800_000.0, ledger._null))


@contextlib.contextmanager
def _away(engine: str, url: str, request: pytest.FixtureRequest) -> Iterator[None]:
    """The database takes no writes: a SQLite file another writer holds, a PostgreSQL server stopped."""
    if engine == "sqlite":
        holder = sqlite3.connect(url[len("sqlite:///") :], isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        try:
            yield
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        return
    pg = request.getfixturevalue("pg")
    pg.stop()
    try:
        yield
    finally:
        pg.start()


def _url(engine: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    return f"sqlite:///{tmp_path / 'ledger.db'}" if engine == "sqlite" else str(request.getfixturevalue("pg").url)


@pytest.mark.parametrize("engine", ["sqlite", "postgresql"])
@pytest.mark.parametrize("trouble", ["full", "unwritable"])
def test_rows_the_spill_file_cannot_take_are_counted_and_said_once_per_outage(
    engine: str, trouble: str, tmp_path: Path, request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture
) -> None:
    url = _url(engine, tmp_path, request)
    if trouble == "full":
        spill, cap = tmp_path / "spill", 4096  # no batch fits
    else:
        (tmp_path / "a-file").write_text("")
        spill, cap = tmp_path / "a-file" / "spill", 1 << 20  # a directory that cannot be made
    caplog.set_level(logging.INFO, logger="gateway")

    async def run() -> None:
        ledger = Ledger(LedgerConfig(url=url, timeout_ms=300, spill_dir=str(spill), spill_bytes=cap))
        await ledger.start()
        try:
            with _away(engine, url, request):
                for _ in range(TURNS):
                    _rows(ledger, ROWS)
                    await ledger.flush()  # never raises: a writer turn that fails would lose uncounted rows
                assert ledger.spill.lost == TURNS * ROWS
                assert ledger.down is not None
            _rows(ledger, ROWS)
            await ledger.flush()
            assert ledger.down is None
        finally:
            await ledger.close()

    asyncio.run(run())
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(said) == 2, said  # once when the outage first loses rows, once when it is over
    what = "the spill file is full (ledger.spill_bytes = 4096)" if trouble == "full" else "cannot be written"
    assert what in said[0] and f"({ROWS} so far)" in said[0], said
    assert said[1].startswith(f"ledger: {TURNS * ROWS} row(s) lost during the outage"), said
    assert not any("writer turn failed" in m for m in said)
    assert query(url, "SELECT count(*) FROM requests") == [(ROWS,)]


def test_a_turn_during_an_outage_reads_one_spilled_batch_not_the_whole_file(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Each writer turn of an outage tries the spill file's oldest batch again: it decodes that one, not every
    batch the file holds (a long outage fills it to `spill_bytes`, 256 MiB, and the turns come every second)."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"

    async def run() -> tuple[int, int]:
        ledger = Ledger(LedgerConfig(url=url, timeout_ms=100, spill_dir=str(tmp_path / "spill")))
        await ledger.start()
        try:
            with _away("sqlite", url, request):
                for _ in range(30):
                    _rows(ledger, 500)
                    await ledger.flush()
                assert ledger.spill.lost == 0 and ledger.spill.size > 2_500_000
                tracemalloc.start()
                try:
                    await ledger.flush()  # nothing new: only the oldest spilled batch, tried again
                    peak = tracemalloc.get_traced_memory()[1]
                finally:
                    tracemalloc.stop()
                return peak, ledger.spill.size
        finally:
            await ledger.close()

    peak, size = asyncio.run(run())
    assert peak < size / 2, (peak, size)  # the whole file decoded: five times its size
    assert query(url, "SELECT count(*) FROM requests") == [(30 * 500,)]


def test_a_sqlite_file_that_is_no_longer_a_database_is_an_outage_not_refused_rows(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The ledger's file overwritten (a restore gone wrong, a disk fault): the database is unavailable, so rows
    are spilled and replayed once the file is a database again, never set aside as rows it refused."""
    db = tmp_path / "ledger.db"
    url = f"sqlite:///{db}"

    async def run() -> None:
        ledger = Ledger(LedgerConfig(url=url, timeout_ms=300, spill_dir=str(tmp_path / "spill")))
        await ledger.start()
        try:
            _rows(ledger, ROWS)
            await ledger.flush()
            with _away("sqlite", url, request):  # an outage, after which the file is overwritten
                _rows(ledger, ROWS)
                await ledger.flush()
                assert ledger.spilling == 1
            with contextlib.closing(sqlite3.connect(db)) as conn:  # every page in the file, none in its journal
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            with db.open("r+b") as f:
                header = f.read(100)
                f.seek(0)
                f.write(b"\x42" * 100)
            _rows(ledger, ROWS)
            await ledger.flush()
            assert (ledger.refused, ledger.spilling) == (0, 1)
            assert ledger.down is not None and "not a database" in ledger.down
            with db.open("r+b") as f:
                f.write(header)
            await ledger.flush()
            assert (ledger.refused, ledger.spilling) == (0, 0)
            assert not ledger.trouble  # the file answers again
        finally:
            await ledger.close()

    asyncio.run(run())
    assert query(url, "SELECT count(*) FROM requests") == [(3 * ROWS,)]
    assert not list((tmp_path / "spill").glob("ledger-refused-*"))


def test_a_sqlite_file_that_is_not_a_database_is_one_line_at_start_up(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    db.write_text("not a database, but a file of text long enough to have a header " * 4)
    path = tmp_path / "config.yaml"
    path.write_text(config(f"sqlite:///{db}"))
    result = run_cli(["serve", "--config", str(path), "--port", "0"], env=cli_env(**ENV))
    assert (result.returncode, result.stdout) == (1, ""), result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"config error: {path}: ledger: sqlite file {db}: file is not a database"
    ), result.stderr
