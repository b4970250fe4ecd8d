"""A stored input file is checked as it is read, a chunk at a time: wherever its chunks cut its lines (in a
line, at a newline, in a blank tail), the batch gets the lines and the errors of the whole file checked at once.

The gateway's own `Store` on a real SQLite file (or PostgreSQL) stands for a runner: the file is stored in
chunks of every size from one byte up, and `checking.check` reads it back as the runner does."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Final

import pytest

from gateway.batches import checking, files, leases, store
from gateway.batches.lines import batch_model, parse
from gateway.ledger.engine import Cursor, Database
from tests.helpers.postgres import PostgresServer

from .conftest import jsonl, line

ME: Final = "host-a:boot-a:1:100:aaaa"
ENDPOINT: Final = "/v1/completions"
MAX_LINES: Final = 6
MAX_BYTES: Final = 2048

_GOOD = jsonl([line("a"), line("b", model="slow"), line("c", stream=True)])
FILES: Final = {
    "valid": _GOOD,
    "no last newline": _GOOD.rstrip(b"\n"),
    "blank tail": _GOOD + b"  \n \t",
    "blank line": _GOOD + b"\n" + jsonl([line("d")]),
    "not json, then more": jsonl([line("a")]) + b"{nope\n" + jsonl([line("b"), line("a")]),
    "long line": jsonl([line("l", prompt="p" * 1500)]) + _GOOD,
    "empty": b"",
    "only blank": b" \n\n ",
    "too many lines": jsonl([line(f"x{i}") for i in range(MAX_LINES + 1)]),
    "too large": jsonl([line(f"y{i}", prompt="p" * 600) for i in range(4)]),
    "utf-8 across a cut": _GOOD + json.dumps(line("d", prompt="\u00e9" * 9), ensure_ascii=False).encode(),
    "not utf-8": _GOOD + json.dumps(line("d", prompt="\u00e9" * 9), ensure_ascii=False).encode()[:-20] + b'\xff"}}',
}


def _made(data: bytes, size: int) -> Any:
    def made(cur: Cursor) -> tuple[str, str]:
        file_id = files.begin_upload(cur, "owner")
        for seq, at in enumerate(range(0, len(data), size)):
            files.add_chunk(cur, file_id, seq, data[at : at + size])
        files.finish_upload(cur, file_id, "owner", "in.jsonl", len(data), 100)
        batch_id = store.add_batch(cur, "owner", file_id, ENDPOINT, "24h", 86_400.0, None, 100)
        assert leases.claim(cur, ME, 30.0, [], {}) == batch_id
        return batch_id, file_id

    return made


def _result(cur: Cursor, batch_id: str) -> tuple[str, Any, list[str], Any, int]:
    status, errors, model, failed = cur.rows(
        "SELECT status, errors, model, failed FROM batches WHERE id = ?", (batch_id,)
    )[0]
    stored = cur.rows("SELECT custom_id FROM batch_lines WHERE batch_id = ? ORDER BY idx", (batch_id,))
    return str(status), errors and json.loads(errors), [str(r[0]) for r in stored], model, int(failed or 0)


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


@pytest.mark.parametrize("name", list(FILES))
async def test_a_file_read_in_chunks_is_checked_as_the_whole_file(url: str, name: str) -> None:
    data = FILES[name]
    lines, errors = parse(data, ENDPOINT, MAX_LINES, MAX_BYTES)
    db = store.Store(url, 5000, lambda: 30_000)
    try:
        for size in sorted({1, 2, 3, 7, 64, 500, max(len(data), 1)}):
            batch_id, file_id = await db.run(_made(data, size))
            await checking.check(db, batch_id, ME, 30.0, ENDPOINT, file_id, MAX_LINES, MAX_BYTES)
            status, got_errors, stored, model, refused = await db.run(_result, batch_id)
            if errors:
                assert status == "failed" and stored == [], (name, size)
                want = [{"code": e.code, "message": e.message, "param": e.param, "line": e.line} for e in errors]
                assert got_errors == want, (name, size)
            else:
                assert status == "in_progress", (name, size, got_errors)
                assert stored == [x.custom_id for x in lines], (name, size)
                assert refused == sum(x.refusal is not None for x in lines) == 1, (name, size)  # `c` streams
                assert model == batch_model(lines), (name, size)
    finally:
        await db.close()
