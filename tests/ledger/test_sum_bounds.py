"""Sums of several rollups past 64 bits stop at the largest 64-bit integer on both engines: the usage
views and a budget's seed read them, on a real SQLite file (whose `sum` raises "integer overflow", which
the gateway would take for the ledger being down) and on the suite's PostgreSQL.

One team's day is planted as two rollups at the bound (one per target, each more than 16 requests at
`CALL_COST_MAX`): the day's views report it at the bound, and the team's daily budget of $9,000,000
(below the bound) refuses its next request.
"""

from __future__ import annotations

import functools
import sqlite3
import time
from pathlib import Path
from typing import Final

import pytest

from gateway.ledger import sums
from gateway.ledger.engine import Database
from gateway.ledger.replay import commit
from gateway.limits.prices import CALL_COST_MAX
from gateway.limits.saturating import INT64_MAX
from gateway.limits.usage import day_of, usd
from tests.helpers.clients import body, client
from tests.helpers.postgres import PostgresServer
from tests.helpers.servers import GatewayThread

from .conftest import ADMIN_KEY, ENV, TEAM_KEY, config

BEYOND: Final = 2**63 // CALL_COST_MAX + 2  # rows at the cap whose sum is past a 64-bit integer


def _plant(url: str, day: str) -> None:
    db = Database(url)
    rows = [
        (f"p{target}{i}", f"r{target}{i}", 0.0, day, "alice", "blue", "fast", f"demo/{target}", "demo", "openai")
        + (0, 200, None, 1.0, 1.0, 3, 7, CALL_COST_MAX, None, 1, None, None)
        for target in ("long", "text")
        for i in range(BEYOND)
    ]
    try:
        db.migrate()
        db.transaction(functools.partial(commit, rows=rows, db=db))
    finally:
        db.close()


def _views_and_budget_at_the_bound(tmp_path: Path, url: str) -> None:
    today = day_of(time.time())
    _plant(url, today)
    path = tmp_path / "config.yaml"
    path.write_text(config(url).replace("blue: {}", "blue: {max_cost_per_day: 9000000}"))
    with GatewayThread(path, ENV) as gw:
        with client(gw.url, ADMIN_KEY) as c:
            day = c.get("/admin/usage", params={"day": today})
            ranged = c.get("/admin/usage", params={"from": today, "to": today, "by": "team"})
        with client(gw.url, TEAM_KEY) as c:
            refused = c.post("/v1/completions", json=body())
    assert day.status_code == 200, day.text
    alice = day.json()["keys"]["alice"]
    assert (alice["cost"], alice["requests"]) == (usd(INT64_MAX), 2 * BEYOND)
    assert alice["by_model"]["fast"]["cost"] == usd(INT64_MAX)
    assert ranged.status_code == 200, ranged.text
    [row] = ranged.json()["rows"]
    assert (row["team"], row["cost"], row["requests"]) == ("blue", usd(INT64_MAX), 2 * BEYOND)
    # The seed is the bound, over the budget: refused, not counted from this process's own (empty) state.
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["code"] == "budget_exceeded"


def test_sums_past_64_bits_stop_at_them_sqlite(tmp_path: Path) -> None:
    _views_and_budget_at_the_bound(tmp_path, f"sqlite:///{tmp_path / 'ledger.db'}")


def test_sums_past_64_bits_stop_at_them_postgres(tmp_path: Path, pg: PostgresServer) -> None:
    _views_and_budget_at_the_bound(tmp_path, pg.url)


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([2**53, 1, 1], 2**53 + 2),  # exact where a float (`total()`) is not
        ([INT64_MAX, INT64_MAX, 5], INT64_MAX),
        ([], None),  # as `sum`: NULL over no rows
    ],
)
def test_the_saturating_aggregate_on_a_sqlite_file(tmp_path: Path, values: list[int], expected: int | None) -> None:
    conn = sqlite3.connect(tmp_path / "sums.db")
    try:
        sums.register(conn)
        conn.execute("CREATE TABLE t (x INTEGER)")
        conn.executemany("INSERT INTO t VALUES (?)", [(v,) for v in values])
        assert conn.execute("SELECT sum64(x) FROM t").fetchall() == [(expected,)]
    finally:
        conn.close()
