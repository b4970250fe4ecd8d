"""A checked file's lines are stored in many short transactions, never one long one: the process's other
leases (renewed on the same store thread) and the batch's own are renewed between them, so no replica takes
over its batches while a large file is stored. A holder that stopped part-way leaves the batch `validating`,
and whoever takes it over stores every line once; a cancel between two transactions ends the batch with no
lines, never `in_progress`.

The gateway's own `Store` on a real SQLite file (or PostgreSQL) stands for a holder; a real gateway in a
thread on the same file takes its batches over and runs them."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import openai
import pytest

from gateway.batches import cancelling, leases, store
from gateway.batches.lines import Line, Refusal, parse
from gateway.ledger.engine import Cursor, Database
from tests.helpers.postgres import PostgresServer
from tests.helpers.sqlite import opened

from .conftest import jsonl, line, results, served, upload, wait_batch

HOLDER: Final = "host-a:boot-a:1:100:aaaa"  # another host's runner: the gateway waits for its lease
TAKER: Final = "host-b:boot-b:1:100:bbbb"
ENDPOINT: Final = "/v1/completions"


def _lines(n: int, prompt: str = "p") -> list[Line]:
    return [Line(f"c{i}", b'{"model": "fast", "prompt": "%s"}' % prompt.encode()) for i in range(n)]


def _holding(lease_s: float, owner: str = "owner", file_id: str = "file-x") -> Callable[[Cursor], str]:
    """A transaction that makes a batch of `owner`'s and claims it as HOLDER at once (no runner of the
    gateway's can take it between)."""

    def made(cur: Cursor) -> str:
        batch_id = store.add_batch(cur, owner, file_id, ENDPOINT, "24h", 86_400.0, None, 100)
        claimed = leases.claim(cur, HOLDER, lease_s, [], {})
        assert claimed == batch_id
        return batch_id

    return made


def _stored(db: Path, batch_id: str) -> tuple[str, Any, int, int, int]:
    """status, in_progress_at, lines, distinct line numbers, most sends of one line."""
    with opened(db, timeout=10) as conn:
        status, started = conn.execute(
            "SELECT status, in_progress_at FROM batches WHERE id = ?", (batch_id,)
        ).fetchone()
        n, distinct, sends = conn.execute(
            "SELECT count(*), count(DISTINCT idx), coalesce(max(sends), 0) FROM batch_lines WHERE batch_id = ?",
            (batch_id,),
        ).fetchone()
    return str(status), started, int(n), int(distinct), int(sends)


def _uploaded(client: openai.OpenAI, db: Path, data: bytes) -> tuple[str, str]:
    """An uploaded input file's id and its owner as the database holds it (a batch made by hand names it)."""
    file_id = upload(client, data)
    with opened(db, timeout=10) as conn:
        owner = str(conn.execute("SELECT owner FROM batch_files WHERE id = ?", (file_id,)).fetchone()[0])
    return file_id, owner


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    db = Database(url)
    db.migrate()
    db.close()
    return url


async def test_other_leases_are_renewed_while_a_large_file_is_stored(sqlite_url: str) -> None:
    db = store.Store(sqlite_url, 5000, lambda: 30_000)
    try:
        batch_id = await db.run(_holding(30.0))
        other = await db.run(_holding(30.0))  # another batch this process drives, lines in flight
        lines = _lines(50_000, "x" * 1000)  # 50 MB: about a second in one transaction
        t0 = time.monotonic()
        storing = asyncio.ensure_future(store.validated(db, batch_id, HOLDER, 30.0, lines, []))
        renewed = []  # when each renewal of the other lease committed, while the lines were stored
        while not storing.done():
            await db.run(leases.held, other, HOLDER, 30.0)
            if not storing.done():
                renewed.append(time.monotonic())
            await asyncio.sleep(0.005)
        await storing
        took = time.monotonic() - t0
        status, total = (
            await db.run(lambda cur: cur.rows("SELECT status, total FROM batches WHERE id = ?", (batch_id,)))
        )[0]
    finally:
        await db.close()
    assert (status, total) == ("in_progress", 50_000)
    gaps = [b - a for a, b in zip([t0, *renewed], [*renewed, t0 + took], strict=True)]
    assert len(renewed) >= 4, f"{len(renewed)} renewals in {took:.2f} s of storing"
    assert max(gaps) < took / 3, f"the other lease waited {max(gaps):.2f} s of {took:.2f} s"


async def test_a_batch_whose_lines_take_longer_than_its_lease_to_store_keeps_it(sqlite_url: str) -> None:
    lease_s = 0.25  # a small part of the time the lines take to store: a transaction takes far less
    holder, taker = (store.Store(sqlite_url, 5000, lambda: 1000) for _ in range(2))
    try:
        batch_id = await holder.run(_holding(lease_s))
        lines = _lines(200_000)
        t0 = time.monotonic()
        storing = asyncio.ensure_future(store.validated(holder, batch_id, HOLDER, lease_s, lines, []))
        while not storing.done():  # another replica tries to take it over all along
            assert await taker.run(leases.claim, TAKER, 30.0, [], {}) is None, "taken over while its lines were stored"
            await asyncio.sleep(0.05)
        await storing
        took = time.monotonic() - t0
    finally:
        await holder.close()
        await taker.close()
    status, _, stored, _, _ = _stored(Path(sqlite_url.removeprefix("sqlite:///")), batch_id)
    assert (status, stored) == ("in_progress", 200_000)
    if took < 2 * lease_s:
        pytest.skip(f"this machine stored the lines in {took:.2f} s, within the lease: nothing was shown")


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return str(request.getfixturevalue("sqlite_url"))
    pg: PostgresServer = request.getfixturevalue("pg")
    db = Database(pg.url)
    db.migrate()
    db.close()
    return pg.url


async def test_a_takeover_stores_each_line_once_after_a_holder_stopped_part_way(url: str) -> None:
    lease_s = 0.3
    holder, taker = (store.Store(url, 5000, lambda: 1000) for _ in range(2))
    n = store.STORE_LINES * 3 + 7
    lines = _lines(n)
    lines[5] = Line(
        "c5", b'{"model": "fast", "prompt": "p", "stream": true}', Refusal(400, "invalid_value", "stream", "no")
    )
    counted = "SELECT status, count(idx), count(DISTINCT idx), sum(CASE WHEN state = 'err' THEN 1 ELSE 0 END) "
    counted += "FROM batches LEFT JOIN batch_lines ON batch_id = id WHERE id = ? GROUP BY status"
    try:
        batch_id = await holder.run(_holding(lease_s))
        chunk = store.STORE_LINES
        assert await holder.run(store.store_lines, batch_id, HOLDER, lease_s, lines[:chunk], 0) == 1
        assert await holder.run(store.store_lines, batch_id, HOLDER, lease_s, lines[chunk : 2 * chunk], chunk) == 0
        # The holder stops here (it died, or stalled past its lease): the batch is not to be run as it is.
        assert (await holder.run(lambda cur: cur.rows(counted, (batch_id,))))[0] == (
            "validating",
            2 * chunk,
            2 * chunk,
            1,
        )
        await asyncio.sleep(lease_s + 0.1)
        assert await taker.run(leases.claim, TAKER, 30.0, [], {}) == batch_id
        await store.validated(taker, batch_id, TAKER, 30.0, lines, [])
        with pytest.raises(leases.LostLease):  # the stalled holder, awake again, stores nothing more
            await holder.run(store.store_lines, batch_id, HOLDER, lease_s, lines[2 * chunk :], 2 * chunk)
        after = (await taker.run(lambda cur: cur.rows(counted, (batch_id,))))[0]
        row = (await taker.run(lambda cur: cur.rows("SELECT total, failed FROM batches WHERE id = ?", (batch_id,))))[0]
    finally:
        await holder.close()
        await taker.close()
    assert after == ("in_progress", n, n, 1)
    assert tuple(row) == (n, 1)


def test_a_batch_stored_part_way_is_taken_over_and_completed_with_every_line_once(tmp_path: Path) -> None:
    n = store.STORE_LINES * 2 + 300
    asked = [line(f"k-{i}", prompt=f"prompt {i}") for i in range(n)]
    asked[7] = line("k-7", stream=True)  # refused at once: its error is in the error file, once
    data = jsonl(asked)
    lease_s = 2.0
    db = tmp_path / "ledger.db"
    with served(tmp_path) as (_, client):
        file_id, owner = _uploaded(client, db, data)

        async def stop_part_way() -> str:
            holder = store.Store(f"sqlite:///{db}", 5000, lambda: 2000)
            try:
                batch_id = await holder.run(_holding(lease_s, owner, file_id))
                lines, errors = parse(data, ENDPOINT, 50_000, 100 * 1024 * 1024, 8 * 1024 * 1024)
                assert not errors
                for at in range(0, 2 * store.STORE_LINES, store.STORE_LINES):
                    chunk = lines[at : at + store.STORE_LINES]
                    assert await holder.run(store.store_lines, batch_id, HOLDER, lease_s, chunk, at) is not None
                return batch_id
            finally:
                await holder.close()  # and the holder is gone, its lease left to run out

        batch_id = asyncio.run(stop_part_way())
        assert _stored(db, batch_id)[:3] == ("validating", None, 2 * store.STORE_LINES)
        batch = wait_batch(client, batch_id, timeout=90)
        assert batch.status == "completed", batch
        out = results(client, batch.output_file_id)
        err = results(client, batch.error_file_id)
    assert batch.request_counts is not None
    assert (batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed) == (n, n - 1, 1)
    assert sorted(r["custom_id"] for r in out) == sorted(f"k-{i}" for i in range(n) if i != 7)
    assert [(r["custom_id"], r["response"]["status_code"]) for r in err] == [("k-7", 400)]
    assert _stored(db, batch_id)[2:] == (n, n, 1)  # every line once, each sent once


def test_a_cancel_between_two_transactions_ends_the_batch_with_no_lines(tmp_path: Path) -> None:
    asked = [line(f"k-{i}", prompt="x" * 1000) for i in range(store.STORE_LINES * 10)]
    data = jsonl(asked)
    db = tmp_path / "ledger.db"
    with served(tmp_path) as (_, client):
        file_id, owner = _uploaded(client, db, data)

        async def cancelled_while_stored() -> str:
            holder = store.Store(f"sqlite:///{db}", 5000, lambda: 30_000)
            try:
                batch_id = await holder.run(_holding(30.0, owner, file_id))
                lines, _ = parse(data, ENDPOINT, 50_000, 100 * 1024 * 1024, 8 * 1024 * 1024)
                storing = asyncio.ensure_future(store.validated(holder, batch_id, HOLDER, 30.0, lines, []))
                deadline = time.monotonic() + 30
                while _stored(db, batch_id)[2] == 0:
                    assert not storing.done() and time.monotonic() < deadline
                    await asyncio.sleep(0.002)
                # The cancel waits on the holder's store thread (a cancel made on its process): it runs
                # between two of the transactions storing the lines.
                assert (await holder.run(cancelling.cancel, batch_id, None)) is not None
                await storing
                status, started, stored, _, _ = _stored(db, batch_id)
                assert (status, started) == ("cancelling", None)
                assert 0 < stored < len(lines)
                await holder.run(leases.release, batch_id, HOLDER)  # the gateway's runner ends it now
                return batch_id
            finally:
                await holder.close()

        batch_id = asyncio.run(cancelled_while_stored())
        batch = wait_batch(client, batch_id, timeout=30)
    assert batch.status == "cancelled", batch
    assert batch.in_progress_at is None
    assert batch.output_file_id is None and batch.error_file_id is None
    assert batch.request_counts is not None
    assert (batch.request_counts.total, batch.request_counts.failed) == (0, 0)
    assert _stored(db, batch_id)[2] == 0
