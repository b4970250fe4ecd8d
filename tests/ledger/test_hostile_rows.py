"""No client text can make the writer lose a batch: on a real PostgreSQL, with prompts kept.

A U+0000 in a prompt (PostgreSQL's text cannot hold one) is stored as U+FFFD and every row of the turn is
booked. A row the database still refuses (here: one queued with a raw NUL, past the repair) is split
out of its batch, kept in the refused-rows file and counted; the batch's other rows are booked, also when
the batch was spilled during an outage and is replayed afterwards.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec

from gateway.config import LedgerConfig
from gateway.ledger.batch import pending
from gateway.ledger.book import Ledger
from gateway.ops.metrics import Record
from tests.helpers.clients import body, client
from tests.helpers.postgres import PostgresServer
from tests.helpers.servers import GatewayThread
from wire.schema import Usage

from .conftest import COST_PICO, ENV, SOLO_KEY, TEAM_KEY, config, query, totals


def test_a_nul_in_a_prompt_loses_no_row_postgres(pg: PostgresServer, tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    # One writer turn for all 21 rows: the one at shutdown.
    text = config(pg.url, flush_ms=60_000).replace(
        "logging: {requests: false}", "logging: {requests: false, prompts: true}"
    )
    assert "prompts: true" in text
    path.write_text(text)
    with GatewayThread(path, ENV) as gw:
        for key in (TEAM_KEY, SOLO_KEY):
            with client(gw.url, key) as c:
                for _ in range(10):
                    assert c.post("/v1/completions", json=body(model="fast")).status_code == 200
        with client(gw.url, TEAM_KEY) as c:
            assert c.post("/v1/completions", json=body(model="fast", prompt="a\u0000b c")).status_code == 200
        assert totals(pg.url)[0][0] == 0  # nothing written before the drain
    rows, rolled = totals(pg.url)
    assert rows[0] == 21 and rows[4] > 20 * COST_PICO
    assert rows == rolled
    assert query(pg.url, "SELECT count(*) FROM requests WHERE key_name = 'solo'") == [(10,)]
    assert query(pg.url, "SELECT prompt FROM requests WHERE prompt <> 'abc abc abc'") == [("a\ufffdb c",)]


def _rec(i: int) -> Record:
    usage = Usage(prompt_tokens=3, completion_tokens=7, total_tokens=10)
    rec = Record(request_id=f"r-{i}", dialect="openai", key="alice", model="fast", provider="demo", target="demo/long")
    rec.usage, rec.attempts, rec.cost_pico = usage, 1, COST_PICO
    rec.prompt, rec.completion = f"prompt {i}", "done"
    return rec


def _queue(ledger: Ledger, good: int, start: int, bad: bool = True) -> None:
    """`good` rows and (with `bad`) one the database refuses: a raw NUL, queued past the writer's repair."""
    for i in range(start, start + good):
        ledger.queue.append(pending(_rec(i), 0.1, 1_795_800_000.0 + i, None))
    if not bad:
        return
    bad_row = pending(_rec(start + good), 0.1, 1_795_800_000.0, None)
    ledger.queue.append((bad_row[0], (*bad_row[1][:-2], "raw\0nul", None)))


def test_a_row_the_database_refuses_is_split_out_and_counted_postgres(pg: PostgresServer, tmp_path: Path) -> None:
    spill = tmp_path / "spill"

    async def run() -> Ledger:
        ledger = Ledger(LedgerConfig(url=pg.url, spill_dir=str(spill)))
        await ledger.start()
        _queue(ledger, 20, 0)
        await ledger.flush()
        assert (ledger.booked, ledger.refused) == (20, 1)
        # An outage: the batch, its bad row included, goes to the spill file ...
        pg.stop()
        _queue(ledger, 5, 100)
        await ledger.flush()
        assert ledger.spilling == 1 and ledger.refused == 1
        # ... and its replay books the good rows instead of failing at every turn.
        pg.start()
        _queue(ledger, 3, 200)
        await ledger.flush()
        assert ledger.spilling == 0
        assert (ledger.booked, ledger.refused) == (28, 3)
        await ledger.close()
        return ledger

    ledger = asyncio.run(run())
    rows, rolled = totals(pg.url)
    assert rows == rolled == (28, 0, 28 * 3, 28 * 7, 28 * COST_PICO)
    kept = [row for line in ledger.rejects.path.read_bytes().splitlines() for row in msgspec.json.decode(line)]
    assert sorted(r[1] for r in kept) == ["r-105", "r-20", "r-203"]
    assert all(r[20] == "raw\0nul" for r in kept)
    assert not list(spill.glob("ledger-spill-*"))


def test_a_database_that_takes_no_writes_is_an_outage_not_refused_rows_postgres(
    pg: PostgresServer, tmp_path: Path
) -> None:
    """A standby after a failover (or `default_transaction_read_only`) answers every write with an error no row
    caused: the rows are spilled and booked once it takes writes again, never refused (and lost) one by one."""
    import psycopg

    spill = tmp_path / "spill"

    def read_only(on: bool) -> None:
        with psycopg.connect(pg.dsn("postgres"), autocommit=True) as admin:
            admin.execute(f"ALTER DATABASE {pg.dbname} SET default_transaction_read_only = {'on' if on else 'off'}")
            # Sessions take the setting when they start: the gateway's is ended, as a failover ends it.
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                (pg.dbname,),
            )

    async def run() -> Ledger:
        ledger = Ledger(LedgerConfig(url=pg.url, spill_dir=str(spill)))
        await ledger.start()
        _queue(ledger, 10, 0, bad=False)
        await ledger.flush()
        read_only(True)
        for start in (100, 200):  # the first batch meets the ended session, the second the read-only database
            _queue(ledger, 5, start, bad=False)
            await ledger.flush()
        assert ledger.spilling >= 1 and ledger.refused == 0
        read_only(False)
        _queue(ledger, 3, 300, bad=False)
        await ledger.flush()
        assert ledger.spilling == 0 and ledger.refused == 0
        await ledger.close()
        return ledger

    asyncio.run(run())
    rows, rolled = totals(pg.url)
    assert rows == rolled == (23, 0, 23 * 3, 23 * 7, 23 * COST_PICO)
