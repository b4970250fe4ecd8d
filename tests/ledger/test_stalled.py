"""A stalled database is an answer, not a wait: a real PostgreSQL whose tables another session locks, or a
SQLite file another process holds the write lock of, or a PostgreSQL whose processes are stopped (no
statement timeout can fire: the gateway's own bound answers).

While the lock is held, a budgeted request is served within `ledger.timeout_ms` (its budget counted from
what the process knows), `POST /admin/keys` answers 503 `ledger_unavailable` with Retry-After, and `/ready`
answers 503 naming the ledger (`/admin/status` says why to the operator, not to a team's admin).
`/admin/usage` answers 503 as well on PostgreSQL, whose locked tables cannot be read; SQLite's write lock
leaves reads alone (WAL), so there it answers 200. When the lock goes,
`/ready` is 200 again and every row answered meanwhile is booked (spilled, then replayed).
"""

from __future__ import annotations

import os
import signal
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Final

import httpx
import psycopg
import pytest

from tests.helpers.clients import body, client
from tests.helpers.postgres import PostgresServer, binaries
from tests.helpers.servers import GatewayThread
from tests.helpers.waiting import wait_until

from .conftest import ADMIN_KEY, ENV, SOLO_KEY, TEAM_KEY, config, totals

TIMEOUT_MS: Final = 500
# What any answer may take while the database is stalled: its bound, the caller's margin, and slack for a
# loaded machine. Far below the lock's hold.
BOUND_S: Final = TIMEOUT_MS / 1000 + 1.0 + 1.0
HOLD_S: Final = 15.0
BLUE_ADMIN: Final = "adm-stalled-blue-2e8c"


@contextmanager
def locked(url: str) -> Iterator[None]:
    """Every table the gateway reads and writes locked by another session until the block ends: PostgreSQL's
    ACCESS EXCLUSIVE locks, or a SQLite writer that holds the file's write lock."""
    release = threading.Event()
    taken = threading.Event()

    def hold() -> None:
        if url.startswith("sqlite:///"):
            conn = sqlite3.connect(url[len("sqlite:///") :], isolation_level=None)
            conn.execute("BEGIN EXCLUSIVE")
            taken.set()
            release.wait(HOLD_S)
            conn.rollback()
            conn.close()
            return
        with psycopg.connect(url) as pg_conn:
            pg_conn.execute("LOCK TABLE requests, daily, api_keys, counters IN ACCESS EXCLUSIVE MODE")
            taken.set()
            release.wait(HOLD_S)
            pg_conn.rollback()

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    assert taken.wait(10)
    try:
        yield
    finally:
        release.set()
        holder.join(10)


def timed(fn: Callable[[], httpx.Response]) -> tuple[float, httpx.Response]:
    start = time.monotonic()
    out = fn()
    return time.monotonic() - start, out


@pytest.mark.parametrize("engine", ["postgresql", "sqlite"])
def test_a_locked_database_is_answered_within_the_bound(
    engine: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if engine == "sqlite":
        url = f"sqlite:///{tmp_path / 'ledger.db'}"
    else:
        url = request.getfixturevalue("pg").url
    path = tmp_path / "config.yaml"
    text = config(url, extra=f", timeout_ms: {TIMEOUT_MS}").replace("{name: solo,", "{name: solo, max_cost_per_day: 5,")
    text = text.replace("teams: {blue: {},", f'teams: {{blue: {{admin_key: "{BLUE_ADMIN}"}},')
    assert "max_cost_per_day: 5" in text and BLUE_ADMIN in text
    path.write_text(text)
    with GatewayThread(path, ENV) as gw:
        with client(gw.url) as c:
            assert c.get("/ready").status_code == 200
        with locked(url), client(gw.url, SOLO_KEY) as solo, client(gw.url, ADMIN_KEY) as admin:
            # The budgeted key's first request: its counter is seeded from the rollups, which are locked.
            took, resp = timed(lambda: solo.post("/v1/completions", json=body()))
            assert resp.status_code == 200 and took < BOUND_S, took
            took, resp = timed(lambda: admin.post("/admin/keys", json={"name": "ci-bot"}))
            assert resp.status_code == 503 and took < BOUND_S, took
            assert resp.json()["error"]["code"] == "ledger_unavailable"
            assert resp.headers["retry-after"] == "2"
            if engine == "sqlite":
                # SQLite's writer lock holds back writes only: in WAL mode a read sees the last committed
                # state at once, so reports and the key poll go on answering.
                took, resp = timed(lambda: admin.get("/admin/usage", params={"from": "2026-01-01", "to": "2026-01-02"}))
                assert resp.status_code == 200 and took < BOUND_S, (took, resp.text)
                took, resp = timed(lambda: admin.get("/admin/usage"))
                assert resp.status_code == 200 and took < BOUND_S, (took, resp.text)
            else:
                took, resp = timed(lambda: admin.get("/admin/usage", params={"from": "2026-01-01", "to": "2026-01-02"}))
                assert resp.status_code == 503 and took < BOUND_S, took
                assert resp.headers["retry-after"] == "2"
                # Today's books without a range read the ledger too (with this process's queued rows), as bounded.
                took, resp = timed(lambda: admin.get("/admin/usage"))
                assert resp.status_code == 503 and took < BOUND_S, took
                assert resp.json()["error"]["code"] == "ledger_unavailable"
                assert resp.headers["retry-after"] == "2"
                took, resp = timed(lambda: admin.get("/admin/status"))
                assert resp.status_code == 200 and took < BOUND_S * 2, took
                assert resp.json()["usage"]["unavailable"].startswith("the ledger is unavailable: "), resp.json()
            # The writer's commits (and on PostgreSQL the key poller's reads) go unanswered: /ready says so, but
            # not why (it answers anyone, and the reason names the database); /admin/status, behind the admin
            # key, says why.
            with client(gw.url) as anyone:
                wait_until(lambda: anyone.get("/ready").status_code == 503, timeout=BOUND_S * 2)
                ready = anyone.get("/ready").json()
            assert ready == {"status": "degraded", "redis": "disabled", "ledger": "unavailable"}, ready
            state = admin.get("/admin/status").json()["ledger"]
            assert state.startswith("unavailable: ") and ("sqlite file" in state or "postgresql" in state), state
            # A team's admin is told the ledger is down, not the driver's words (they can name the host).
            with client(gw.url, BLUE_ADMIN) as blue:
                view = blue.get("/admin/status").json()
            assert view["ledger"] == "unavailable", view
            if engine != "sqlite":
                assert view["usage"]["unavailable"] == "the ledger is unavailable", view
            for _ in range(4):
                took, resp = timed(lambda: solo.post("/v1/completions", json=body()))
                assert resp.status_code == 200 and took < BOUND_S, took
            with client(gw.url, TEAM_KEY) as team:
                assert team.post("/v1/completions", json=body()).status_code == 200
        with client(gw.url) as c:
            wait_until(lambda: c.get("/ready").status_code == 200, timeout=10)
            assert c.get("/ready").json() == {"status": "ready", "redis": "disabled", "ledger": "ok"}
        with client(gw.url, ADMIN_KEY) as admin:
            assert admin.get("/admin/status").json()["ledger"] == "ok"
        wait_until(lambda: totals(url)[0][0] == 6, timeout=10)
    rows, rolled = totals(url)
    assert rows[0] == 6 and rows == rolled


def server_processes(server: PostgresServer) -> list[int]:
    """The postmaster and its children (each backend is a session of its own, so not its process group)."""
    postmaster = int((server.data / "postmaster.pid").read_text().split()[0])
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue  # ended meanwhile
        if int(fields[1]) == postmaster:
            children.append(int(stat.parent.name))
    return [postmaster, *children]


def test_a_frozen_database_server_is_answered_within_the_bound(tmp_path: Path) -> None:
    """A PostgreSQL that answers nothing at all (its processes stopped: no statement timeout can fire) is
    answered by the gateway's own bound: today's books, the status page and `POST /admin/keys` within it."""
    if binaries() is None:
        pytest.skip("PostgreSQL is not installed")
    with PostgresServer() as server:
        server.fresh_database()
        path = tmp_path / "config.yaml"
        path.write_text(config(server.url, extra=f", timeout_ms: {TIMEOUT_MS}"))
        with GatewayThread(path, ENV) as gw, client(gw.url, ADMIN_KEY) as admin:
            assert admin.get("/admin/usage").status_code == 200
            frozen = server_processes(server)
            for pid in frozen:
                os.kill(pid, signal.SIGSTOP)
            try:
                took, resp = timed(lambda: admin.get("/admin/usage"))
                assert resp.status_code == 503 and took < BOUND_S, took
                assert resp.json()["error"]["code"] == "ledger_unavailable"
                assert resp.headers["retry-after"] == "2"
                took, resp = timed(lambda: admin.post("/admin/keys", json={"name": "ci-bot"}))
                assert resp.status_code == 503 and took < BOUND_S, took
                took, resp = timed(lambda: admin.get("/admin/status"))
                assert resp.status_code == 200 and took < BOUND_S * 2, took
                assert resp.json()["usage"]["unavailable"].startswith("the ledger is unavailable: ")
            finally:
                # As root the postmaster runs under `runuser`, which stops itself when its child stops (job
                # control) and waits for a SIGCONT of its own: thawed too, or it never reaps the postmaster
                # and the server's stop waits out its whole timeout.
                assert server.proc is not None
                for pid in [*frozen, server.proc.pid]:
                    os.kill(pid, signal.SIGCONT)
            wait_until(lambda: admin.get("/admin/usage").status_code == 200, timeout=10)
