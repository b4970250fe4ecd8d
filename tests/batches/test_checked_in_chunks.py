"""A stored input file is checked as it is read, a chunk at a time: wherever its chunks cut its lines (in a
line, at a newline, in a blank tail), the batch gets the lines and the errors of the whole file checked at once;
a line longer than `caps.request_body_bytes` too, though it is not held whole.

The gateway's own `Store` on a real SQLite file (or PostgreSQL) stands for a runner: the file is stored in
chunks of every size from one byte up (on SQLite; a representative few on PostgreSQL), and `checking.check`
reads it back as the runner does."""

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
MAX_LINE: Final = 800  # caps.request_body_bytes
_AT = jsonl([line("k", prompt="p" * 680)])  # a line exactly at the cap
_OVER = jsonl([line("m", prompt="p" * 681)])  # a byte over
_ID_LAST = json.dumps({"method": "POST", "url": ENDPOINT, "body": {"prompt": "p" * 900}, "custom_id": "z"}).encode()
FILES: Final = {
    "valid": _GOOD,
    "no last newline": _GOOD.rstrip(b"\n"),
    "blank tail": _GOOD + b"  \n \t",
    "blank line": _GOOD + b"\n" + jsonl([line("d")]),
    "not json, then more": jsonl([line("a")]) + b"{nope\n" + jsonl([line("b"), line("a")]),
    "long line": jsonl([line("l", prompt="p" * 1500)]) + _GOOD,
    "line at the cap": _GOOD + _AT + jsonl([line("d")]),
    "line over the cap": jsonl([line("a")]) + _OVER + jsonl([line("b"), line("c", stream=True)]),
    "lines over the cap, the last one ending the file": _OVER.replace(b'"m"', b'"m\\"2"') + _GOOD + _OVER[:-1],
    "over the cap, custom_id not first": _GOOD + _ID_LAST + b"\n" + jsonl([line("d")]),
    "over the cap, then its custom_id again": _GOOD + _OVER + jsonl([line("m")]),
    "at the cap, then a line over it": _AT + b"{not json" + b" " * 800 + b"\n" + jsonl([line("d")]),
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


def _result(cur: Cursor, batch_id: str) -> tuple[str, Any, list[tuple[str, Any]], Any, int]:
    """The batch's status, errors, model and lines failed; its lines' custom_ids and, for those refused at
    once, their status, error code and message."""
    status, errors, model, failed = cur.rows(
        "SELECT status, errors, model, failed FROM batches WHERE id = ?", (batch_id,)
    )[0]
    stored = [
        (str(cid), result and _refused(json.loads(result)))
        for cid, result in cur.rows(
            "SELECT custom_id, result FROM batch_lines WHERE batch_id = ? ORDER BY idx", (batch_id,)
        )
    ]
    return str(status), errors and json.loads(errors), stored, model, int(failed or 0)


def _refused(result: Any) -> tuple[int, str, str]:
    error = result["response"]["body"]["error"]
    return result["response"]["status_code"], error["code"], error["message"]


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


def _sizes(url: str, data: bytes) -> list[int]:
    """The chunk sizes `data` is stored in. Where the chunks cut its lines is worked out in Python from the
    bytes read back, the same on either engine: the engine only stores the chunks and returns them in order.
    So SQLite takes the whole sweep, one-byte chunks included (every cut there is); PostgreSQL, a round trip
    per chunk stored and two per chunk read (a one-byte sweep of a 2 KB file is thousands), takes sizes that
    still store a file as many chunks (hundreds at 7 bytes), a few, and one; and as two, the last one byte."""
    whole = max(len(data), 1)
    if url.startswith("sqlite:"):
        return sorted({1, 2, 3, 7, 64, 500, whole})
    return sorted({7, 64, 500, max(whole - 1, 1), whole})


@pytest.mark.parametrize("name", list(FILES))
async def test_a_file_read_in_chunks_is_checked_as_the_whole_file(url: str, name: str) -> None:
    data = FILES[name]
    lines, errors = parse(data, ENDPOINT, MAX_LINES, MAX_BYTES, MAX_LINE)
    db = store.Store(url, 5000, lambda: 30_000)
    try:
        for size in _sizes(url, data):
            batch_id, file_id = await db.run(_made(data, size))
            await checking.check(db, batch_id, ME, 30.0, ENDPOINT, file_id, MAX_LINES, MAX_BYTES, MAX_LINE)
            status, got_errors, stored, model, refused = await db.run(_result, batch_id)
            if errors:
                assert status == "failed" and stored == [], (name, size)
                want = [{"code": e.code, "message": e.message, "param": e.param, "line": e.line} for e in errors]
                assert got_errors == want, (name, size)
            else:
                assert status == "in_progress", (name, size, got_errors)
                want_lines = [
                    (x.custom_id, x.refusal and (x.refusal.status, x.refusal.code, x.refusal.message)) for x in lines
                ]
                assert stored == want_lines, (name, size)
                assert refused == sum(x.refusal is not None for x in lines), (name, size)
                assert model == batch_model(lines), (name, size)
    finally:
        await db.close()
