"""A batch's line is one request: a line longer than `caps.request_body_bytes` is refused without being held
whole, while its file is checked and while its batch runs; the other lines behave as any. Over real sockets:
the gateway in a thread on a real SQLite ledger, the `openai` SDK unmodified."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path
from typing import Any, Final

import pytest

from gateway.batches import leases, store
from gateway.batches.lines import Line
from gateway.ledger.engine import Database
from tests.helpers.postgres import PostgresServer
from tests.helpers.waiting import wait_until

from .conftest import ENV, config, jsonl, line, results, served, upload, wait_batch

_MIB: Final = 1024 * 1024
_CAP: Final = 4096
# What the whole process (gateway and client) may allocate at its peak while a batch is checked or run. Held
# whole, the long lines below took three times their size.
_BOUND: Final = 12 * _MIB


def _exactly(custom_id: str, size: int) -> dict[str, Any]:
    """A line of `size` bytes, without its newline."""
    pad = size - len(json.dumps(line(custom_id, prompt="")))
    made = line(custom_id, prompt="p" * pad)
    assert len(json.dumps(made)) == size
    return made


def _ordered(made: dict[str, Any], *order: str) -> dict[str, Any]:
    """`made`'s members in `order` (the others after them)."""
    return {k: made[k] for k in (*order, *(k for k in made if k not in order))}


def _create(client: Any, file_id: str) -> str:
    return str(client.batches.create(input_file_id=file_id, endpoint="/v1/completions", completion_window="24h").id)


def test_a_line_over_the_cap_is_refused_unread_and_the_others_run(tmp_path: Path) -> None:
    # Spans many of the 1 MiB chunks the file is stored in, its custom_id after its body: found in its tail.
    huge = _ordered(line("huge", prompt="p" * (24 * _MIB)), "method", "url", "body")
    lines = [line("a"), _exactly("at-cap", _CAP), huge, _exactly("over-cap", _CAP + 1), line("b", stream=True)]
    with served(tmp_path, more=f"caps: {{request_body_bytes: {_CAP}}}") as (_, client):
        file_id = upload(client, jsonl(lines))
        del lines, huge
        tracemalloc.start()
        try:
            tracemalloc.reset_peak()
            batch = wait_batch(client, _create(client, file_id), timeout=120)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        out = results(client, batch.output_file_id)
        err = results(client, batch.error_file_id)
    assert peak < _BOUND, f"a batch with a line of 24 MiB took {peak} bytes at its peak"
    assert batch.status == "completed" and batch.errors is None
    counts = batch.request_counts
    assert (counts.total, counts.completed, counts.failed) == (5, 2, 3)
    assert [(r["custom_id"], r["response"]["status_code"]) for r in out] == [("a", 200), ("at-cap", 200)]
    assert [(r["custom_id"], r["response"]["status_code"]) for r in err] == [
        ("huge", 413),
        ("over-cap", 413),
        ("b", 400),
    ]
    huge_error, over_error = err[0]["response"]["body"]["error"], err[1]["response"]["body"]["error"]
    assert huge_error["code"] == over_error["code"] == "request_too_large"
    assert f"has {len(json.dumps(line('huge', prompt='p' * (24 * _MIB))))} bytes" in huge_error["message"]
    assert "(line 3 of the input file)" in huge_error["message"] and "caps.request_body_bytes" in huge_error["message"]
    assert "(line 4 of the input file)" in over_error["message"]


def test_a_line_over_the_cap_is_refused_alone_wherever_its_custom_id_sits_before_or_after_its_body(
    tmp_path: Path,
) -> None:
    """The custom_id among the fields before the body or after it, in a line within one stored chunk or
    spanning several, written with escapes or not: the line is refused alone under it, the others run."""
    big, long = "p" * (2 * _CAP), "p" * (3 * _MIB)
    escaped = (
        b'{"method": "POST", "url": "/v1/completions", "body": {"prompt": "' + big.encode() + b'"}, '
        rb'"custom\u005fid": "q\"uote\\", "n": 1.5e3, "ok": true}'
    )
    lines = [
        jsonl([line("a")]),
        jsonl([_ordered(line("mid", prompt=big), "method", "url", "custom_id")]),
        jsonl([_ordered(line("last", prompt=big), "method", "url", "body")]),
        jsonl([_ordered(line("spans-mid", prompt=long), "url", "custom_id")]),
        jsonl([_ordered(line("spans-after", prompt=long), "body", "custom_id", "method")]),
        escaped + b"\n",
        jsonl([line("b")]),
    ]
    with served(tmp_path, more=f"caps: {{request_body_bytes: {_CAP}}}") as (_, client):
        batch = wait_batch(client, _create(client, upload(client, b"".join(lines))), timeout=60)
        out = results(client, batch.output_file_id)
        err = results(client, batch.error_file_id)
    assert batch.status == "completed" and batch.errors is None
    assert [r["custom_id"] for r in out] == ["a", "b"]
    assert [(r["custom_id"], r["response"]["status_code"]) for r in err] == [
        ("mid", 413),
        ("last", 413),
        ("spans-mid", 413),
        ("spans-after", 413),
        ('q"uote\\', 413),
    ]
    assert all(r["response"]["body"]["error"]["code"] == "request_too_large" for r in err)
    assert "(line 5 of the input file)" in err[3]["response"]["body"]["error"]["message"]


def test_a_line_over_the_cap_whose_custom_id_cannot_be_found_fails_the_batch(tmp_path: Path) -> None:
    big = "p" * _CAP
    # A custom_id inside the body is not the line's; nor is one between two object values, found by neither end.
    nested = {"method": "POST", "body": {"custom_id": "inner", "prompt": big}, "url": "/v1/completions"}
    between = {"method": "POST", "url": "/v1/completions", "body": {"prompt": big}, "custom_id": "x", "metadata": {}}
    cases = {
        "custom_id nested in the body": (jsonl([line("a"), nested, line("b")]), [("line_too_large", 2)]),
        "custom_id between two objects": (jsonl([line("a"), between]), [("line_too_large", 2)]),
        # Its errors are still the whole file's: the lines after it are checked as ever.
        "not JSON, then more errors": (
            jsonl([line("a")]) + b"x" * (3 * _MIB) + b"\n" + jsonl([line("b"), line("a")]) + b"{nope\n",
            [("line_too_large", 2), ("duplicate_custom_id", 4), ("invalid_json_line", 5)],
        ),
        # Its custom_id is read, at either end, and counts as any line's.
        "custom_id used again": (jsonl([_exactly("x", _CAP + 1), line("x")]), [("duplicate_custom_id", 2)]),
        "custom_id last used again": (
            jsonl([line("y"), _ordered(line("y", prompt=big), "body")]),
            [("duplicate_custom_id", 2)],
        ),
    }
    messages: dict[str, list[str]] = {}
    with served(tmp_path, more=f"caps: {{request_body_bytes: {_CAP}}}") as (_, client):
        for name, (data, expected) in cases.items():
            batch = wait_batch(client, _create(client, upload(client, data)))
            assert batch.status == "failed", name
            assert [(e.code, e.line) for e in batch.errors.data] == expected, name
            messages[name] = [e.message for e in batch.errors.data]
    assert messages["custom_id used again"] == ["The custom_id 'x' is used by an earlier line"]
    assert messages["custom_id last used again"] == ["The custom_id 'y' is used by an earlier line"]
    size = len(json.dumps(nested))
    assert messages["custom_id nested in the body"] == [
        f"This line has {size} bytes, more than the {_CAP} caps.request_body_bytes allows (line 2 of the input "
        "file), and has no custom_id (a string) where the gateway looks for one in a line it does not hold whole: "
        "among its fields before its first object or array value, or after its last one within its last 65536 bytes"
    ]


def test_a_line_stored_under_a_larger_cap_is_refused_unread_when_it_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reload lowers `caps.request_body_bytes` after the file was checked: the runner refuses the longer
    line as the interactive route's door would, without reading it from the database."""
    for name, value in ENV.items():  # a reload reads the process's environment
        monkeypatch.setenv(name, value)
    before, after = 32 * _MIB, _CAP
    slow = [line(f"slow-{i}", model="slower") for i in range(20)]  # 400 ms each, one at a time: 8 s
    big = line("big", prompt="p" * (16 * _MIB))
    path = tmp_path / "config.yaml"
    settings: dict[str, Any] = {"concurrency": 1}
    with served(tmp_path, more=f"caps: {{request_body_bytes: {before}}}", **settings) as (gw, client):
        batch_id = _create(client, upload(client, jsonl([*slow, big, line("after")])))
        del big
        wait_batch(client, batch_id, lambda b: b.status != "validating")
        path.write_text(
            config(f"sqlite:///{tmp_path / 'ledger.db'}", more=f"caps: {{request_body_bytes: {after}}}", **settings)
        )
        wait_until(lambda: gw.pipeline.loaded.config.caps.request_body_bytes == after, timeout=10)
        tracemalloc.start()
        try:
            tracemalloc.reset_peak()
            running = client.batches.retrieve(batch_id)
            batch = wait_batch(client, batch_id, timeout=60)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        err = results(client, batch.error_file_id)
    assert running.request_counts is not None
    assert running.request_counts.completed < len(slow), "the reload came after the long line was sent"
    assert batch.status == "completed" and batch.request_counts.completed == len(slow) + 1
    assert [(r["custom_id"], r["response"]["status_code"]) for r in err] == [("big", 413)]
    assert err[0]["response"]["body"]["error"]["code"] == "request_too_large"
    assert peak < _BOUND, f"running a batch with a line of 16 MiB took {peak} bytes at its peak"


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


async def test_a_body_over_the_cap_is_not_read_from_the_database(url: str) -> None:
    """The runner's read of lines to send: a body over the cap in force is None, in UTF-8 bytes (not
    characters) on SQLite and PostgreSQL alike."""
    holder = "host-a:boot-a:1:100:aaaa"
    at_cap = '{"prompt": "' + "\u00e9" * ((_CAP - 14) // 2) + '"}'  # 2 bytes a character
    assert len(at_cap.encode()) == _CAP
    bodies = {"small": b"{}", "at-cap": at_cap.encode(), "over": at_cap.encode()[:-2] + b' "}'}
    db = store.Store(url, 5000, lambda: 30_000)
    try:
        batch_id = await db.run(store.add_batch, "owner", "file-x", "/v1/completions", "24h", 86_400.0, None, 100)
        assert await db.run(leases.claim, holder, 30.0, [], {}) == batch_id
        await store.validated(db, batch_id, holder, 30.0, [Line(cid, body) for cid, body in bodies.items()], [])
        _, taken, _ = await db.run(store.take, batch_id, holder, 30.0, 10, _CAP)
    finally:
        await db.close()
    assert [(cid, body) for _, cid, body in taken] == [("small", "{}"), ("at-cap", at_cap), ("over", None)]
