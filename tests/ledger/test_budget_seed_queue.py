"""What a budget's seed adds of this process's rows still queued for the writer: the cost of the rows its
key (by identity, or by name for rows booked without one) or its team answered within its period, every
budget due summed at once (gateway/ledger/budgets.py), over the rollups `Ledger.read` makes of rows the
real `pending` queues."""

from __future__ import annotations

import asyncio
import calendar
import datetime as dt
import itertools
from collections import deque
from pathlib import Path

from gateway.config import LedgerConfig
from gateway.ledger.batch import Pending, pending, rollups, take
from gateway.ledger.book import Ledger
from gateway.ledger.budgets import _waiting
from gateway.limits.budgets import Budget
from gateway.ops.metrics import Record
from tests.helpers.postgres import PostgresServer

from .conftest import query

DAY = "2026-11-30"
NOON = calendar.timegm(dt.date.fromisoformat(DAY).timetuple()) + 12 * 3600


def _row(key: str, key_id: str, team: str, cost: int, ended: float = NOON) -> Pending:
    rec = Record(request_id="r", dialect="openai", key=key, model="m", provider="p", target="p/m")
    rec.key_id, rec.team, rec.cost_pico = key_id, team, cost
    return pending(rec, 0.01, ended, 0)


def test_each_budget_sums_its_own_rows_in_its_period() -> None:
    rows = deque(
        [
            _row("capped", "id-capped", "blue", 1),
            _row("capped", "", "blue", 10),  # booked under the name, before rows named an identity
            _row("capped", "id-other-config", "", 100),  # a same-named key of another config
            _row("mate", "id-mate", "blue", 1_000),
            _row("capped", "id-capped", "blue", 10_000, NOON - 86_400),  # yesterday: in the month only
            _row("capped", "id-capped", "blue", 100_000, NOON + 40 * 86_400),  # next month: in neither
        ]
    )
    budgets = [
        Budget("Key 'capped'", "id-capped", "key_id", "daily", DAY, DAY, 1.0, "capped"),
        Budget("Key 'capped'", "id-capped", "key_id", "monthly", "2026-11-01", "2026-11-30", 1.0, "capped"),
        Budget("Team 'blue'", "blue", "team", "daily", DAY, DAY, 1.0),
        Budget("Key 'mate'", "id-mate", "key_id", "daily", DAY, DAY, 1.0),
        Budget("Key 'new'", "id-new", "key_id", "daily", DAY, DAY, 1.0),  # no name of its own booked
    ]
    waiting = rollups(take(rows, "", itertools.repeat(0)))  # as `Ledger.read` makes them of a copy
    assert _waiting(waiting, budgets) == [11, 10_011, 1_011, 1_000, 0]


def test_rows_spilled_while_the_database_takes_no_writes_still_count(pg: PostgresServer, tmp_path: Path) -> None:
    """A database that answers reads but not writes (a lock held elsewhere): the writer spills, and a budget
    seeded meanwhile reads what is committed plus what waits, the spill file's rows included; once they are
    replayed they count once, as committed rows."""
    import psycopg

    async def run() -> None:
        ledger = Ledger(LedgerConfig(url=pg.url, timeout_ms=300, spill_dir=str(tmp_path / "spill")))
        await ledger.start()
        try:
            with psycopg.connect(pg.url) as locker:
                locker.execute("LOCK TABLE requests IN EXCLUSIVE MODE")  # writes wait on it, reads do not
                for cost in (5, 7):
                    ledger.queue.append(_row("capped", "id-capped", "blue", cost))
                await ledger.flush()
                assert ledger.spilling == 1
                booked, waiting = await ledger.read(lambda cur: cur.rows("SELECT count(*) FROM requests"))
                assert booked == [(0,)]
                assert _waiting(waiting, [BUDGET]) == [12]
                locker.rollback()
            await ledger.flush()
            assert ledger.spilling == 0
            booked, waiting = await ledger.read(lambda cur: cur.rows("SELECT count(*) FROM requests"))
            assert booked == [(2,)] and _waiting(waiting, [BUDGET]) == [0]
        finally:
            await ledger.close()

    asyncio.run(run())


BUDGET = Budget("Key 'capped'", "id-capped", "key_id", "daily", DAY, DAY, 1.0, "capped")


def test_spilled_batches_replayed_before_the_database_went_away_again_count_once(
    pg: PostgresServer, tmp_path: Path
) -> None:
    """A replay the database interrupts (it went away again after the spill file's first batch): the batch it
    committed counts once, as committed, in what a view or a budget's seed reads; the one still waiting, once,
    as spilled."""
    import psycopg

    nextday = (dt.date.fromisoformat(DAY) + dt.timedelta(days=1)).isoformat()
    month = Budget("Key 'capped'", "id-capped", "key_id", "monthly", "2026-11-01", "2026-12-31", 1.0, "capped")

    async def seen(ledger: Ledger) -> int:
        booked, waiting = await ledger.read(lambda cur: cur.rows("SELECT sum(cost_pico) FROM daily"))
        return int(booked[0][0] or 0) + _waiting(waiting, [month])[0]

    async def run() -> None:
        ledger = Ledger(LedgerConfig(url=pg.url, timeout_ms=300, spill_dir=str(tmp_path / "spill")))
        await ledger.start()
        try:
            # Both days' partitions exist, so that one of them can be locked alone below.
            ledger.queue.extend(
                [_row("capped", "id-capped", "blue", 1), _row("capped", "id-capped", "blue", 2, NOON + 86_400)]
            )
            await ledger.flush()
            with psycopg.connect(pg.url) as locker:
                locker.execute("LOCK TABLE requests IN EXCLUSIVE MODE")
                ledger.queue.append(_row("capped", "id-capped", "blue", 10))
                await ledger.flush()  # the spill file's first batch
                ledger.queue.append(_row("capped", "id-capped", "blue", 100, NOON + 86_400))
                await ledger.flush()  # and its second, of the next day
                assert await seen(ledger) == 113
                locker.rollback()
                # The next day's rows cannot be written now: the replay books the first batch, then stops.
                locker.execute(f"LOCK TABLE requests_d{nextday.replace('-', '')} IN ACCESS EXCLUSIVE MODE")
                await ledger.flush()
                assert ledger.spilling == 1
                assert query(pg.url, "SELECT sum(cost_pico) FROM daily") == [(13,)]
                assert await seen(ledger) == 113
                locker.rollback()
            await ledger.flush()
            assert ledger.spilling == 0
            assert await seen(ledger) == 113
        finally:
            await ledger.close()

    asyncio.run(run())
