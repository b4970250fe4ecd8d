"""What the Batch API holds in memory stays bounded by what it must: a file of too many lines is refused
before its lines are cut out, a batch's result files are sized by the database rather than read whole, and
a result file is read a bounded number of bytes at a time while it is sent, the file itself unchanged. On a
real SQLite file and on PostgreSQL."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Final, TypeVar

import pytest

from gateway.batches import files, leases, store
from gateway.batches.lines import parse
from gateway.batches.objects import ERR, OK
from gateway.ledger.engine import Cursor, Database
from tests.helpers.postgres import PostgresServer
from tests.helpers.sqlite import opened

from .conftest import line, served, start, wait_batch

T = TypeVar("T")
HOLDER: Final = "host-a:boot-a:1:100:aaaa"
ENDPOINT: Final = "/v1/completions"


def _peak(fn: Callable[[], T]) -> tuple[T, int]:
    """What `fn` returns, and the most Python memory it held at once beyond what was held before."""
    tracemalloc.start()
    try:
        out = fn()
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_file_of_too_many_lines_is_refused_before_its_lines_are_cut_out() -> None:
    data = b"ab\n" * (2 * 1024 * 1024)  # 6 MiB of lines so short that a list of them costs 15 times the file
    (lines, errors), peak = _peak(lambda: parse(data, ENDPOINT, 50_000, 100 * 1024 * 1024, 8 * 1024 * 1024))
    assert lines == [] and [(e.code, e.line) for e in errors] == [("too_many_lines", 50_001)]
    assert str(len(data) // 3) in errors[0].message
    assert peak < len(data) // 4, f"{peak} bytes held for a file of {len(data)}"


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'ledger.db'}"
    else:
        pg: PostgresServer = request.getfixturevalue("pg")
        url = pg.url
    db = Database(url)
    db.migrate()
    db.close()
    return url


def _answered(results: dict[str, list[str]]) -> Callable[[Cursor], str]:
    """A transaction making a batch held by HOLDER whose lines were answered: `results` by line state."""

    def made(cur: Cursor) -> str:
        batch_id = store.add_batch(cur, "owner", "file-x", ENDPOINT, "24h", 86_400.0, None, 100)
        assert leases.claim(cur, HOLDER, 60, [], {}) == batch_id
        answers = [(s, r) for s in results for r in results[s]]
        rows = [(batch_id, i, f"c{i}", "{}", s, 1, r) for i, (s, r) in enumerate(answers)]
        cur.executemany(
            "INSERT INTO batch_lines (batch_id, idx, custom_id, body, state, sends, result) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            rows,
        )
        return batch_id

    return made


def test_a_batch_is_finished_without_reading_its_results_and_they_are_read_in_bounded_turns(url: str) -> None:
    # Results of several bytes a character, so that a size counted in characters would be caught.
    ok = [f'{{"n": {i}, "text": "{"é" * (20_000 + i)}"}}' for i in range(300)]
    err = ["€" * 5]
    db = Database(url)
    try:
        batch_id = db.transaction(_answered({OK: ok, ERR: err}))
        _, peak = _peak(lambda: db.transaction(lambda cur: store.finish(cur, batch_id, HOLDER, 60, "completed", [])))
        held = sum(len(r) for r in ok)
        assert peak < held // 10, f"{peak} bytes held to finish a batch of {held} bytes of results"
        row = db.transaction(lambda cur: store.batch_row(cur, batch_id, None))
        assert row is not None
        made = [db.transaction(partial(files.file_row, file_id=f, owner=None)) for f in (row[21], row[22])]
        assert [m[4] if m else None for m in made] == [sum(len(r.encode()) + 1 for r in ok), len(err[0].encode()) + 1]

        turns: list[list[tuple[int, str]]] = []
        after, most = -1, 200_000
        read = partial(store.result_chunk, batch_id=batch_id, state=OK, limit=1000, max_bytes=most)
        while chunk := db.transaction(partial(read, after=after)):
            turns.append(chunk)
            after = chunk[-1][0]
        assert [text for turn in turns for _, text in turn] == ok
        assert all(len(t) == 1 or sum(len(x.encode()) for _, x in t) <= most for t in turns)
        assert len(turns) > 30  # about 40 KB a line: four or five lines a turn
        big = db.transaction(lambda cur: store.result_chunk(cur, batch_id, OK, -1, 1000, 10))
        assert [i for i, _ in big] == [0]  # a line longer than the bound is a turn of its own
    finally:
        db.close()


def test_a_result_file_larger_than_one_turn_downloads_whole(tmp_path: Path) -> None:
    with served(tmp_path) as (_, client):
        batch = wait_batch(client, start(client, [line(f"r-{i}") for i in range(12)]))
        assert batch.status == "completed" and batch.output_file_id is not None
        # Every result made large (1 MiB each): the file is sent in several turns of the read.
        with opened(tmp_path / "ledger.db", timeout=10) as conn:
            conn.execute(
                "UPDATE batch_lines SET result = ? || idx || '\"}' WHERE batch_id = ?",
                ('{"pad": "' + "x" * (1024 * 1024) + '", "n": "', batch.id),
            )
            conn.commit()
        text = client.files.content(batch.output_file_id).content
    want = b"".join(b'{"pad": "' + b"x" * (1024 * 1024) + b'", "n": "%d"}\n' % i for i in range(12))
    assert text == want
