"""Under load, from two gateway processes, on both engines: every answered request booked once, rollups equal
to their rows; kill -9 loses at most the last flush interval's rows; a database away for 10 s loses none.

The gateways are `python -m gateway serve` children; the clients run `CONCURRENCY` requests at a time and
keep each answer's `x-request-id`, which is the row's `request_id`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.helpers.clients import body
from tests.helpers.postgres import PostgresServer
from tests.helpers.redis import RedisServer
from tests.helpers.servers import GatewayProcess, cli_env
from tests.helpers.waiting import wait_until

from .conftest import COST_PICO, ENV, TEAM_KEY, config, query, totals

CONCURRENCY = 16


def ledger_url(engine: str, tmp_path: Path, pg: Callable[[], PostgresServer]) -> str:
    return f"sqlite:///{tmp_path / 'ledger.db'}" if engine == "sqlite" else pg().url


async def drive(urls: list[str], n: int, answered: dict[str, float], until: Callable[[], bool] | None = None) -> int:
    """`n` requests (or, with `until`, requests until it is true) spread over `urls`; answered ids -> end time.
    Returns how many failed."""
    failed = 0
    counter = iter(range(10**9))

    async def worker(c: httpx.AsyncClient) -> None:
        nonlocal failed
        while True:
            i = next(counter)
            if (until is None and i >= n) or (until is not None and until()):
                return
            try:
                resp = await c.post(f"{urls[i % len(urls)]}/v1/completions", json=body())
            except httpx.TransportError:
                failed += 1
                continue
            if resp.status_code == 200:
                answered[resp.headers["x-request-id"]] = time.monotonic()
            else:
                failed += 1

    headers = {"authorization": f"Bearer {TEAM_KEY}"}
    async with httpx.AsyncClient(trust_env=False, timeout=15, headers=headers) as c:
        await asyncio.gather(*(worker(c) for _ in range(CONCURRENCY)))
    return failed


@pytest.fixture
def gateways(tmp_path: Path) -> Iterator[list[GatewayProcess]]:
    started: list[GatewayProcess] = []
    yield started
    for gw in started:
        gw.stop()


def start(path: Path, gateways: list[GatewayProcess]) -> GatewayProcess:
    gw = GatewayProcess(path, cli_env(**ENV))
    gateways.append(gw)
    gw.wait_ready()
    return gw


def booked_ids(url: str) -> list[str]:
    return [r[0] for r in query(url, "SELECT request_id FROM requests")]


@pytest.mark.parametrize("engine", ["sqlite", "postgresql"])
def test_two_processes_1000_requests(
    engine: str, tmp_path: Path, gateways: list[GatewayProcess], request: pytest.FixtureRequest
) -> None:
    url = ledger_url(engine, tmp_path, lambda: request.getfixturevalue("pg"))
    path = tmp_path / "config.yaml"
    path.write_text(config(url, extra=f', spill_dir: "{tmp_path / "spill"}"'))
    a, b = start(path, gateways), start(path, gateways)
    answered: dict[str, float] = {}
    assert asyncio.run(drive([a.url, b.url], 1000, answered)) == 0
    for gw in (a, b):
        gw.stop()  # SIGTERM: each drains its queue
    ids = booked_ids(url)
    assert len(ids) == 1000 and set(ids) == set(answered)
    rows, rolled = totals(url)
    assert rows == (1000, 0, 3000, 7000, 1000 * COST_PICO) == rolled


def test_kill_9_loses_at_most_the_last_flush(tmp_path: Path, gateways: list[GatewayProcess]) -> None:
    """`flush_ms: 100`: what a kill -9 can lose is what was answered in the last interval (plus the batch
    being committed); everything answered before that is in the ledger."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    path = tmp_path / "config.yaml"
    path.write_text(config(url, flush_ms=100))
    gw = start(path, gateways)
    answered: dict[str, float] = {}
    killed_at: list[float] = []

    def kill_after_2s() -> bool:
        if not killed_at and len(answered) > 50 and time.monotonic() - min(answered.values()) > 2:
            gw.proc.send_signal(signal.SIGKILL)
            killed_at.append(time.monotonic())
        return bool(killed_at)

    asyncio.run(drive([gw.url], 0, answered, until=kill_after_2s))
    gw.proc.wait(10)
    booked = set(booked_ids(url))
    assert booked <= set(answered)  # nothing booked that was not answered
    lost = {rid for rid in answered if rid not in booked}
    # 0.1 s of flush interval, with room for a commit in flight and a loaded machine.
    assert all(answered[rid] > killed_at[0] - 1.0 for rid in lost), (len(lost), len(answered))
    assert len(answered) - len(lost) > 50
    rows, rolled = totals(url)
    assert rows == rolled


def test_database_away_for_10_s(tmp_path: Path, gateways: list[GatewayProcess], pg: PostgresServer) -> None:
    spill = tmp_path / "spill"
    path = tmp_path / "config.yaml"
    path.write_text(config(pg.url, extra=f', spill_dir: "{spill}"'))
    gw = start(path, gateways)
    answered: dict[str, float] = {}
    began = time.monotonic()
    phases: list[str] = []

    def outage() -> bool:
        elapsed = time.monotonic() - began
        if not phases and elapsed > 1.5:
            pg.stop()
            phases.append("stopped")
        elif phases == ["stopped"] and elapsed > 11.5:
            pg.start()
            phases.append("started")
        return elapsed > 13.5

    marks: dict[str, float] = {}

    def outage_marked() -> bool:
        done = outage()
        for phase in phases:
            marks.setdefault(phase, time.monotonic())
        return done

    assert asyncio.run(drive([gw.url], 0, answered, until=outage_marked)) == 0  # requests kept succeeding
    assert phases == ["stopped", "started"]
    during = [t for t in answered.values() if marks["stopped"] < t < marks["started"]]
    assert len(during) > 100, len(during)  # served while the database was away
    wait_until(lambda: len(booked_ids(pg.url)) >= len(answered), timeout=20, interval=0.2)
    ids = booked_ids(pg.url)
    assert len(ids) == len(set(ids)) == len(answered) and set(ids) == set(answered)  # all arrived, none twice
    rows, rolled = totals(pg.url)
    assert rows == rolled and rows[0] == len(answered)
    gw.stop()
    assert not list(spill.glob("*.jsonl"))  # replayed and removed
    log = gw.log.read_text()
    assert "ledger: cannot write" in log and "spilled row(s) replayed" in log, log


def spilled_rows(spill: Path) -> int:
    """Rows in the spill files: one JSON list of rows per line (a line being written may be cut)."""
    count = 0
    for f in spill.glob("*.jsonl"):
        for line in f.read_bytes().splitlines():
            with contextlib.suppress(ValueError):
                count += len(json.loads(line))
    return count


def test_a_dead_processs_spill_file_is_replayed_by_another(
    tmp_path: Path, gateways: list[GatewayProcess], pg: PostgresServer
) -> None:
    """Rows spilled while the database was away, by a process then killed -9, reach the ledger through the
    next process that finds the file (its lock died with its owner), once."""
    spill = tmp_path / "spill"
    path = tmp_path / "config.yaml"
    path.write_text(config(pg.url, extra=f', spill_dir: "{spill}"'))
    first = start(path, gateways)
    pg.stop()
    answered: dict[str, float] = {}
    assert asyncio.run(drive([first.url], 30, answered)) == 0
    wait_until(lambda: spilled_rows(spill) == 30, timeout=10)  # all of them out of the queue, into the file
    first.proc.send_signal(signal.SIGKILL)
    first.proc.wait(10)
    pg.start()
    second = start(path, gateways)
    wait_until(lambda: len(booked_ids(pg.url)) >= 30, timeout=15, interval=0.1)
    ids = booked_ids(pg.url)
    assert sorted(ids) == sorted(answered)
    assert totals(pg.url)[0] == totals(pg.url)[1]
    second.stop()
    assert not list(spill.glob("*.jsonl"))


def test_a_redis_restart_loses_no_row(tmp_path: Path, gateways: list[GatewayProcess], redis: RedisServer) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    path = tmp_path / "config.yaml"
    path.write_text(config(url).replace("logging:", f'redis: {{url: "{redis.url}"}}\nlogging:'))
    gw = start(path, gateways)
    answered: dict[str, float] = {}
    assert asyncio.run(drive([gw.url], 100, answered)) == 0
    redis.restart()
    assert asyncio.run(drive([gw.url], 100, answered)) == 0
    gw.stop()
    assert sorted(booked_ids(url)) == sorted(answered) and len(answered) == 200


def test_a_full_spill_file_is_counted_and_logged_never_blocks(
    tmp_path: Path, gateways: list[GatewayProcess], pg: PostgresServer
) -> None:
    """`spill_bytes: 4096`: about a dozen rows fit; the rest are counted and logged while requests go on."""
    path = tmp_path / "config.yaml"
    path.write_text(config(pg.url, extra=f', spill_dir: "{tmp_path / "spill"}", spill_bytes: 4096'))
    gw = start(path, gateways)
    pg.stop()
    answered: dict[str, float] = {}
    assert asyncio.run(drive([gw.url], 200, answered)) == 0  # every request served

    def lost() -> float:
        text = httpx.get(f"{gw.url}/metrics", timeout=5, trust_env=False).text
        line = next(x for x in text.splitlines() if x.startswith("gateway_ledger_spill_lost_rows "))
        return float(line.split()[1])

    wait_until(lambda: lost() > 100, timeout=10, interval=0.1)
    gw.stop()
    assert "ledger: the spill file is full (ledger.spill_bytes = 4096)" in gw.log.read_text()


def test_granian_forked_workers_book_every_request(tmp_path: Path, gateways: list[GatewayProcess]) -> None:
    """Granian forks its workers from `serve`'s process, which migrated the ledger: each worker still draws
    its own ids, so no worker's rows are taken for another's."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    path = tmp_path / "config.yaml"
    path.write_text(config(url))
    gw = GatewayProcess(path, cli_env(**ENV), flags=["--server", "granian", "--workers", "2"])
    gateways.append(gw)
    gw.wait_ready()
    answered: dict[str, float] = {}

    def both_workers() -> bool:  # req_<process prefix><counter>: until both have answered (or 10 s)
        return len({rid[4:20] for rid in answered}) == 2

    deadline = time.monotonic() + 10
    while not both_workers() and time.monotonic() < deadline:
        assert asyncio.run(drive([gw.url], 50, answered)) == 0
    assert both_workers()
    gw.stop()
    assert sorted(booked_ids(url)) == sorted(answered)
    rows, rolled = totals(url)
    assert rows == rolled and rows[0] == len(answered)
