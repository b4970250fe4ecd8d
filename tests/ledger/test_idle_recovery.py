"""An outage's end is seen without traffic: while the ledger is down, each writer turn with nothing to write
asks the database whether it takes writes again, so an idle gateway's status page, `/ready` and
`gateway_ledger_unavailable` say "up" within a few `flush_ms` of the database answering, not at the next
request. The outages are the ones where nothing waits in the spill file to be replayed (the replay of
spilled rows finds the end on its own): rows the spill file cannot take, and another process's spill file
whose replay the outage interrupted. On a SQLite file another writer holds and on a stopped PostgreSQL."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import httpx
import pytest

from gateway.config import LedgerConfig
from gateway.ledger.book import Ledger
from tests.helpers.clients import body, client
from tests.helpers.postgres import PostgresServer
from tests.helpers.servers import GatewayThread
from tests.helpers.waiting import wait_until

from .conftest import ADMIN_KEY, ENV, SOLO_KEY, config
from .test_spill_listing import _dead_file, _ids, _pending
from .test_stalled import locked

FLUSH_MS: Final = 200
# Far more than the few writer turns the end of an outage takes to be seen, for a loaded machine; without a
# probe it is never seen at all.
SEEN_S: Final = 15.0


@contextlib.contextmanager
def _outage(engine: str, url: str, request: pytest.FixtureRequest) -> Iterator[None]:
    if engine == "sqlite":
        with locked(url):
            yield
        return
    pg: PostgresServer = request.getfixturevalue("pg")
    pg.stop()
    try:
        yield
    finally:
        pg.start()


def _unavailable(gw_url: str) -> float:
    text = httpx.get(f"{gw_url}/metrics", timeout=5, trust_env=False).text
    found = [ln for ln in text.splitlines() if ln.startswith("gateway_ledger_unavailable ")]
    assert found, "gateway_ledger_unavailable is not exported"
    return float(found[0].split()[1])


@pytest.mark.parametrize("engine", ["sqlite", "postgresql"])
def test_an_idle_gateway_sees_the_database_answer_again(
    engine: str, tmp_path: Path, request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}" if engine == "sqlite" else str(request.getfixturevalue("pg").url)
    (tmp_path / "a-file").write_text("")
    spill = tmp_path / "a-file" / "spill"  # a directory that cannot be made: the outage's rows are lost, not spilled
    path = tmp_path / "config.yaml"
    path.write_text(config(url, flush_ms=FLUSH_MS, extra=f', timeout_ms: 500, spill_dir: "{spill}"'))
    caplog.set_level(logging.WARNING, logger="gateway")
    with GatewayThread(path, ENV) as gw, client(gw.url, ADMIN_KEY) as admin, client(gw.url) as anyone:
        assert admin.get("/admin/status").json()["ledger"] == "ok"
        assert _unavailable(gw.url) == 0.0
        with _outage(engine, url, request):
            with client(gw.url, SOLO_KEY) as solo:
                assert solo.post("/v1/completions", json=body()).status_code == 200
            wait_until(lambda: gw.pipeline.ledger is not None and gw.pipeline.ledger.spill.lost == 1, timeout=SEEN_S)
            state = admin.get("/admin/status").json()["ledger"]
            assert state.startswith("unavailable: "), state
            assert anyone.get("/ready").status_code == 503
            assert _unavailable(gw.url) == 1.0
        # No request from here on: nothing for the writer to write.
        wait_until(lambda: admin.get("/admin/status").json()["ledger"] == "ok", timeout=SEEN_S, interval=0.1)
        assert anyone.get("/ready").json() == {"status": "ready", "redis": "disabled", "ledger": "ok"}
        assert _unavailable(gw.url) == 0.0
        ledger = gw.pipeline.ledger
        assert ledger is not None and ledger.booked == 0 and ledger.spill.lost == 1
    # The line that ends the outage says what happened: nothing was spilled, so nothing was replayed.
    said = [r.getMessage() for r in caplog.records if "answers again" in r.getMessage()]
    assert len(said) == 1 and said[0].endswith("answers again; no spilled row to replay"), said


def test_an_interrupted_replay_of_another_process_file_ends_without_traffic(pg: PostgresServer, tmp_path: Path) -> None:
    """A dead process's spill file whose replay the outage interrupted: once the database answers, the writer says
    so, looks for the file again and replays it, with no row of its own to write."""
    spill = tmp_path / "spill"
    spill.mkdir()
    _dead_file(spill, 700)

    async def run() -> None:
        ledger = Ledger(LedgerConfig(url=pg.url, spill_dir=str(spill), timeout_ms=1000))
        await ledger.start()
        try:
            pg.stop()
            await ledger.flush()  # the dead file is found, its replay fails: the database is down
            assert ledger.down is not None and ledger.trouble is not None
            pg.start()
            await ledger.flush()  # nothing to write: the writer asks, and the outage is over
            assert ledger.down is None
            await ledger.flush()  # the next turn looks for the file again
            assert not (spill / "ledger-spill-1-dead700.jsonl").exists()
        finally:
            await ledger.close()

    asyncio.run(run())
    assert _ids(pg.url) == ["r-700", "r-701", "r-702"]


def test_a_database_that_takes_reads_but_not_writes_stays_down(pg: PostgresServer, tmp_path: Path) -> None:
    """The writer's question is whether a batch could be committed, not whether the server answers: a database
    that takes no writes (a standby after a failover, `default_transaction_read_only`) keeps the ledger down
    while it reads well, and the outage ends when it takes writes again."""
    import psycopg

    (tmp_path / "a-file").write_text("")
    spill = tmp_path / "a-file" / "spill"  # rows are lost, not spilled: no replay finds the outage's end

    def read_only(on: bool) -> None:
        with psycopg.connect(pg.dsn("postgres"), autocommit=True) as admin:
            admin.execute(f"ALTER DATABASE {pg.dbname} SET default_transaction_read_only = {'on' if on else 'off'}")
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                (pg.dbname,),
            )

    async def run() -> None:
        ledger = Ledger(LedgerConfig(url=pg.url, spill_dir=str(spill), timeout_ms=1000))
        await ledger.start()
        try:
            read_only(True)
            ledger.queue.extend(_pending(0, 3))
            for _ in range(2):  # the first turn meets the ended session, the next the read-only database
                await ledger.flush()
            assert ledger.down is not None and ledger.spill.lost >= 3
            for _ in range(3):
                await ledger.flush()  # nothing to write: asked, and still refused
                assert ledger.down is not None and "read-only" in ledger.down, ledger.down
            read_only(False)
            await ledger.flush()
            assert ledger.down is None
        finally:
            await ledger.close()

    asyncio.run(run())


def test_the_end_of_an_outage_says_how_many_spilled_rows_were_replayed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    caplog.set_level(logging.WARNING, logger="gateway")

    async def run() -> None:
        ledger = Ledger(LedgerConfig(url=url, spill_dir=str(tmp_path / "spill"), timeout_ms=500))
        await ledger.start()
        try:
            with locked(url):
                ledger.queue.extend(_pending(0, 3))
                await ledger.flush()  # the file is locked: the rows go to the spill file
                assert ledger.down is not None
            await ledger.flush()
            assert ledger.down is None
        finally:
            await ledger.close()

    asyncio.run(run())
    assert _ids(url) == ["r-0", "r-1", "r-2"]
    said = [r.getMessage() for r in caplog.records if "answers again" in r.getMessage()]
    assert len(said) == 1 and said[0].endswith("answers again; 3 spilled row(s) replayed"), said
