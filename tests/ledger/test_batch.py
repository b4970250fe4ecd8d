"""A writer's batch books exactly the rows the spill file would: every column, on both engines.

The writer inserts a batch in its compact form (each distinct combination of repeated values once,
written into its own statement on SQLite when it has enough rows, or one JSON `INSERT ... SELECT` on
PostgreSQL); a spilled batch is replayed as plain rows. Both must give the same rows and rollups.
"""

from __future__ import annotations

import functools
import itertools
from collections import deque
from pathlib import Path
from typing import Any

from gateway.ledger.batch import _rows_sql, commit_batch, pending, row_ids, take
from gateway.ledger.engine import Database
from gateway.ledger.replay import commit
from gateway.ops.metrics import Record
from tests.helpers.postgres import PostgresServer
from wire.schema import Usage

from .conftest import query, totals

DAY_END = 1_795_823_999.5  # 2026-11-27 23:59:59.5 UTC: a batch that spans midnight


def records() -> list[tuple[Record, float, float]]:
    """Rows of every shape: many of one kind (SQLite's statements of 50 rows), a few of others,
    quotes and a NUL in text values, errors, cache outcomes, prompts kept, no usage, two days."""
    out: list[tuple[Record, float, float]] = []
    served = functools.partial(Record, model="fast", provider="demo", target="demo/long", attempts=1)
    usage = Usage(prompt_tokens=3, completion_tokens=7, total_tokens=10)
    alice: dict[str, Any] = {"key": "alice", "key_id": "cfg_a1", "team": "blue"}
    for i in range(30):
        rec = served(request_id=f"req-{i}", dialect="openai", usage=usage, upstream_s=0.25, **alice)
        rec.cost_pico = 17 * 10**9 + i
        out.append((rec, 0.5 + i / 1000, DAY_END - 1.5 + i / 10))  # the last ten end on the next day
    for i in range(70):  # enough of one kind for SQLite's statements of 50 rows, then of 8, then of one
        rec = served(request_id=f"bulk-{i}", dialect="openai", key="solo", usage=usage, upstream_s=0.125)
        rec.cost_pico = 5 * 10**9 + i
        out.append((rec, 0.25 + i / 1000, DAY_END - 200 + i))
    for i in range(12):  # a key name with a quote, prompts logged (one of them "0", one empty)
        rec = served(request_id=f"q-{i}", dialect="sgp", key="o'brien", stream=True, usage=usage)
        rec.prompt, rec.completion = ("0", "") if i == 0 else (f"say 'hi' {i}", None)
        rec.cache_outcome = "miss"
        out.append((rec, 1.25, DAY_END - 100))
    for i in range(9):  # a model with a NUL (bound as a parameter, never part of a statement)
        out.append((Record(request_id=f"n-{i}", dialect="openai", model="bad\0model", status=404), 0.01, DAY_END - 50))
    for i in range(10):  # refused before any call: no target, no provider, no time to a first byte
        rec = Record(request_id=f"anon-{i}", dialect="pais", status=401, error_code="invalid_api_key", upstream_s=0.1)
        out.append((rec, 0.002, DAY_END))
    rec = served(request_id="cached", dialect="openai", usage=usage, cached=True, **alice)
    rec.cache_outcome = "hit"
    out.append((rec, 0.003, DAY_END - 1))
    for i in range(3):  # chat requests of the same key and model: entries of their own
        rec = served(request_id=f"chat-{i}", dialect="openai", usage=usage, endpoint="chat", **alice)
        out.append((rec, 0.2, DAY_END - 2))
    return out


def book_both(url_batch: str, url_rows: str, expected: int) -> None:
    """The records into one database as a batch, into the other as the rows a spill file replays."""
    for url, as_rows in ((url_batch, False), (url_rows, True)):
        db = Database(url)
        db.migrate()
        recs = records()
        if db.postgres:  # PostgreSQL's text cannot hold a NUL at all
            recs = [r for r in recs if "\0" not in r[0].model]
        null = None if db.postgres else 0
        queue = deque(pending(rec, elapsed, ended, null) for rec, elapsed, ended in recs)
        batch = take(queue, "p", itertools.count(1))
        if as_rows:  # replayed: plain rows, looked up first
            assert db.transaction(functools.partial(commit, rows=batch.full(), db=db)) == expected
        else:
            assert db.transaction(functools.partial(commit_batch, batch=batch, db=db)) == expected
        db.close()


def everything(url: str) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    rows = query(url, "SELECT * FROM requests ORDER BY id")
    daily = query(url, "SELECT * FROM daily ORDER BY day, key_name, team, model, target")
    return rows, daily


def test_a_batch_books_what_its_rows_would_sqlite(tmp_path: Path) -> None:
    a, b = f"sqlite:///{tmp_path / 'a.db'}", f"sqlite:///{tmp_path / 'b.db'}"
    book_both(a, b, 135)
    assert everything(a) == everything(b)
    rows, rolled = totals(a)
    assert rows == rolled and rows[0] == 135
    one = query(
        a, "SELECT day, key_name, key_id, team, ttfb_ms, latency_ms, cost_pico FROM requests WHERE request_id = 'req-0'"
    )
    assert one == [("2026-11-27", "alice", "cfg_a1", "blue", 250.0, 500.0, 17 * 10**9)]
    # The rollups keep the key's identity and count the cache's answers.
    assert query(
        a, "SELECT key_id, sum(requests), sum(cached) FROM daily WHERE key_name = 'alice' GROUP BY key_id"
    ) == [("cfg_a1", 34, 1)]
    assert query(a, "SELECT count(*) FROM requests WHERE day = '2026-11-28'") == [(10,)]
    assert query(a, "SELECT endpoint, count(*) FROM requests GROUP BY endpoint ORDER BY endpoint") == [
        ("chat", 3),
        ("completions", 132),
    ]
    quoted = query(a, "SELECT key_name, stream, prompt, completion, cache FROM requests WHERE request_id LIKE 'q-%'")
    assert ("o'brien", 1, "0", "", "miss") in quoted and ("o'brien", 1, "say 'hi' 3", None, "miss") in quoted
    assert query(a, "SELECT model, ttfb_ms, error FROM requests WHERE request_id = 'n-0'") == [
        ("bad\0model", None, None)
    ]
    assert query(a, "SELECT key_name, target, error, ttfb_ms FROM requests WHERE request_id = 'anon-0'") == [
        ("anonymous", "", "invalid_api_key", None)
    ]


def test_a_batch_books_what_its_rows_would_postgres(pg: PostgresServer) -> None:
    a = pg.url
    pg.fresh_database()
    b = pg.url
    book_both(a, b, 126)
    assert everything(a) == everything(b)
    rows, rolled = totals(a)
    assert rows == rolled and rows[0] == 126
    assert query(a, "SELECT key_name, key_id, team, ttfb_ms, stream FROM requests WHERE request_id = 'req-0'") == [
        ("alice", "cfg_a1", "blue", 250.0, 0)
    ]
    assert query(a, "SELECT sum(cached) FROM daily WHERE key_name = 'alice'") == [(1,)]
    assert query(a, "SELECT key_id, endpoint FROM requests WHERE request_id = 'chat-0'") == [("cfg_a1", "chat")]
    assert query(a, "SELECT count(*) FROM requests WHERE day = '2026-11-28'") == [(10,)]
    assert query(a, "SELECT key_name, prompt, completion FROM requests WHERE request_id = 'q-0'") == [
        ("o'brien", "0", "")
    ]


def test_a_replayed_batch_books_nothing_twice(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    db = Database(url)
    db.migrate()
    batch = take(deque(pending(*r, 0) for r in records()), "p", itertools.count(1))
    assert db.transaction(functools.partial(commit_batch, batch=batch, db=db)) == 135
    assert db.transaction(functools.partial(commit, rows=batch.full(), db=db)) == 0
    db.close()
    rows, rolled = totals(url)
    assert rows == rolled and rows[0] == 135


def test_many_kinds_of_rows_share_a_dozen_statements(tmp_path: Path) -> None:
    """200 keys of 9 rows each: every key's rows are booked, through the same few statement texts."""
    url = f"sqlite:///{tmp_path / 'many.db'}"
    db = Database(url)
    db.migrate()
    recs = [
        Record(
            request_id=f"m-{k}-{i}", dialect="openai", key=f"key-{k}", model="fast", provider="demo", target="demo/long"
        )
        for k in range(200)
        for i in range(9)
    ]
    queue = deque(pending(rec, 0.5, DAY_END - 10, 0) for rec in recs)
    batch = take(queue, "p", itertools.count(1))
    assert len(batch.entries) == 200
    assert db.transaction(functools.partial(commit_batch, batch=batch, db=db)) == 1800
    db.close()
    assert _rows_sql.cache_info().currsize <= 12
    assert query(url, "SELECT count(*), count(DISTINCT key_name) FROM requests") == [(1800, 200)]
    assert query(url, "SELECT sum(requests) FROM daily") == [(1800,)]


def test_row_ids_are_the_prefix_and_each_number_drawn_across_thousands() -> None:
    for first in (1, 998, 999, 1_000, 10**9 - 1, 10**9, 10**9 + 997):
        for n in (0, 1, 2, 3, 1_000, 2_501):
            ids = itertools.count(first)
            assert row_ids("p-", ids, n) == [f"p-{i}" for i in range(first, first + n)], (first, n)
            assert next(ids) == first + n  # exactly n drawn: the next batch goes on from there
