"""`ledger.retention_days`: old rows go in bounded batches (SQLite) or whole day partitions (PostgreSQL).

Old days are planted with the engine's own client; the gateway removes them at its writer's first turn.
"""

from __future__ import annotations

import asyncio
import functools
import time
from pathlib import Path

import msgspec
import pytest

from gateway.config import LedgerConfig
from gateway.ledger.book import Ledger
from gateway.ledger.engine import Database
from gateway.ledger.replay import commit
from gateway.limits.usage import day_of
from tests.helpers.clients import body, client
from tests.helpers.servers import GatewayThread
from tests.helpers.waiting import wait_until

from .conftest import ENV, TEAM_KEY, config, query

OLD_ROWS = 12_000  # more than one SQLite batch (5000)


def plant(url: str, days_ago: list[int], per_day: int) -> None:
    db = Database(url)
    try:
        db.migrate()
        for ago in days_ago:
            day = day_of(time.time() - ago * 86_400)
            rows = [
                (f"old-{ago}-{i}", f"req-{ago}-{i}", 0.0, day, "alice", "blue", "fast", "demo/long", "demo")
                + ("openai", 0, 200, None, 1.0, 1.0, 3, 7, 10, None, 1, None, None)
                for i in range(per_day)
            ]
            db.transaction(functools.partial(commit, rows=rows, db=db))
    finally:
        db.close()


@pytest.mark.parametrize("engine", ["sqlite", "postgresql"])
def test_retention_removes_old_days_only(engine: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}" if engine == "sqlite" else request.getfixturevalue("pg").url
    plant(url, [40, 31], OLD_ROWS // 2)
    plant(url, [29, 1], 10)  # within 30 days: kept
    path = tmp_path / "config.yaml"
    path.write_text(config(url, extra=f', retention_days: 30, spill_dir: "{tmp_path / "spill"}"'))
    with GatewayThread(path, ENV) as gw:
        with client(gw.url, TEAM_KEY) as c:
            assert c.post("/v1/completions", json=body()).status_code == 200
        wait_until(lambda: query(url, "SELECT count(*) FROM requests")[0][0] == 21, timeout=20, interval=0.1)
    kept = {r[0] for r in query(url, "SELECT day FROM requests")}
    assert kept == {day_of(time.time() - ago * 86_400) for ago in (29, 1, 0)}
    # The rollups stay: reports over old days still answer.
    assert query(url, "SELECT sum(requests) FROM daily")[0][0] == OLD_ROWS + 21
    if engine == "postgresql":
        partitions = query(
            url,
            "SELECT count(*) FROM pg_inherits i JOIN pg_class p ON p.oid = i.inhparent WHERE p.relname = 'requests'",
        )
        assert partitions == [(3,)]


@pytest.mark.parametrize("engine", ["sqlite", "postgresql"])
def test_spilled_rows_of_days_retention_removed_are_not_booked_again(
    engine: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A spill file replayed after retention removed its days' rows (a replay interrupted after its first
    batches were booked, resumed weeks later): the ids can no longer be looked up, so booking those rows again
    would count them twice in the rollups. Rows older than `retention_days` are dropped at replay and counted."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}" if engine == "sqlite" else request.getfixturevalue("pg").url
    plant(url, [40], 5)
    plant(url, [1], 2)
    db = Database(url)
    try:
        db.retain(day_of(time.time() - 29 * 86_400), 5000, 10)
    finally:
        db.close()
    assert query(url, "SELECT count(*) FROM requests") == [(2,)]
    before = query(url, "SELECT sum(requests), sum(cost_pico) FROM daily")[0]
    old, recent = day_of(time.time() - 40 * 86_400), day_of(time.time() - 86_400)
    spill = tmp_path / "spill"
    spill.mkdir()
    # A dead process's file: the five old rows booked (and removed by retention) since, one recent row booked
    # too, and one recent row never booked.
    rows = [
        [f"old-40-{i}", f"req-40-{i}", 0.0, old, "alice", "blue", "fast", "demo/long", "demo", "openai", 0, 200]
        + [None, 1.0, 1.0, 3, 7, 10, None, 1, None, None, "", None, "completions"]
        for i in range(5)
    ]
    for rid in ("old-1-0", "new-1-0"):
        rows.append([rid, "req", 0.0, recent, *rows[0][4:]])
    (spill / "ledger-spill-1-000000000000.jsonl").write_bytes(msgspec.json.encode(rows) + b"\n")

    async def run() -> int:
        cfg = LedgerConfig(url=url, retention_days=30, spill_dir=str(spill))
        ledger = Ledger(cfg)
        await ledger.start()
        try:
            await ledger.flush()
            assert not list(spill.glob("ledger-spill-*"))
            return ledger.expired
        finally:
            await ledger.close()

    assert asyncio.run(run()) == 5
    after = query(url, "SELECT sum(requests), sum(cost_pico) FROM daily")[0]
    assert (int(after[0]), int(after[1])) == (int(before[0]) + 1, int(before[1]) + 10)
    assert query(url, "SELECT count(*) FROM requests") == [(3,)]
