"""A batch's cost in the ledger across restarts: one `requests` row per answered line, never one more or less.

The ledger's writer is given a flush interval far longer than the test, so only a row committed with its line
(`store.record`) can be in the ledger when the gateway is SIGKILLed. At SIGTERM the lines in flight are
answered within `server.shutdown_grace_ms` and booked; a line still hanging then is cut without a row and sent
again by the next gateway. SQLite and PostgreSQL: the ledger's rows, the `daily` rollups and the batch's
`usage` say the same.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest
from aiohttp import web

from tests.helpers.servers import GatewayChild, cli_env
from tests.helpers.sqlite import opened
from tests.helpers.upstreams import Received, Upstream

from .conftest import ENV, EVAL_KEY, config, jsonl, line, results, sdk, upload, wait_batch

LINES = 40
CONCURRENCY = 6
HUNG = ("prompt 12", "prompt 13")  # their first send hangs until the gateway cuts it (SIGTERM)
PROMPT_TOKENS, COMPLETION_TOKENS = 7, 11

Query = Callable[[str, Sequence[Any]], list[tuple[Any, ...]]]


def _query(url: str) -> Query:
    def run(sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        if url.startswith("sqlite:///"):
            with opened(url.removeprefix("sqlite:///"), timeout=10) as conn:
                return conn.execute(sql, params).fetchall()
        with psycopg.connect(url, autocommit=True) as conn:
            return conn.execute(sql.replace("?", "%s"), params).fetchall()

    return run


class _Upstream(Upstream):
    """Answers each line after a moment; the first send of a `HUNG` prompt waits until `released`."""

    def __init__(self) -> None:
        super().__init__()
        self.released = threading.Event()
        self.handler = self._answer

    async def _answer(self, request: web.Request, received: Received) -> web.StreamResponse:
        prompt = received.json()["prompt"]
        if prompt in HUNG and [r.json()["prompt"] for r in self.received].count(prompt) == 1:
            while not self.released.is_set():
                await asyncio.sleep(0.05)
        await asyncio.sleep(0.25)
        choice = {"index": 0, "text": f"echo {prompt}", "finish_reason": "stop", "logprobs": None}
        usage = {
            "prompt_tokens": PROMPT_TOKENS,
            "completion_tokens": COMPLETION_TOKENS,
            "total_tokens": PROMPT_TOKENS + COMPLETION_TOKENS,
        }
        body = {"id": "c", "object": "text_completion", "created": 1, "choices": [choice], "usage": usage}
        return web.json_response(body)

    def seen(self) -> Counter[str]:
        return Counter(r.json()["prompt"] for r in self.received)


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'ledger.db'}"
    return str(request.getfixturevalue("pg").url)


def _until(query: Query, batch_id: str, done: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 60
    while not done():
        assert time.monotonic() < deadline, (
            what,
            query("SELECT status, completed FROM batches WHERE id = ?", [batch_id]),
        )
        time.sleep(0.02)


def _completed(query: Query, batch_id: str) -> int:
    found = query("SELECT completed FROM batches WHERE id = ?", [batch_id])
    return int(found[0][0]) if found else 0


def _booked(query: Query, batch_id: str, n: int) -> bool:
    return _completed(query, batch_id) >= n


def _start(tmp_path: Path, url: str, up: Upstream) -> tuple[Path, GatewayChild, str]:
    path = tmp_path / "config.yaml"
    more = f'  local: {{kind: vllm, base_url: "{up.url}/v1", discover: false}}\nserver: {{shutdown_grace_ms: 2000}}'
    # The writer commits nothing on its own within the test: a row is in the ledger only if it was committed
    # with its line, or at a SIGTERM's drain.
    text = config(url, lease_ms=600_000, concurrency=CONCURRENCY, more=more).replace("flush_ms: 100", "flush_ms: 60000")
    path.write_text(text)
    gw = GatewayChild(path, env=cli_env(**ENV))
    gw.wait_ready()
    client = sdk(gw.url, EVAL_KEY)
    lines = [line(f"k-{i}", model="local/m", prompt=f"prompt {i}") for i in range(LINES)]
    made = client.batches.create(
        input_file_id=upload(client, jsonl(lines)), endpoint="/v1/completions", completion_window="24h"
    )
    return path, gw, made.id


def _finish_and_check(path: Path, url: str, batch_id: str) -> None:
    """Run the batch to its end on a fresh gateway, then hold the ledger to the batch's output and usage."""
    query = _query(url)
    gw = GatewayChild(path, env=cli_env(**ENV))
    try:
        gw.wait_ready()
        client = sdk(gw.url, EVAL_KEY)
        batch = wait_batch(client, batch_id)
        out = results(client, batch.output_file_id)
    finally:
        gw.stop()  # SIGKILL: nothing the writer still holds can count
    assert batch.status == "completed" and [o["custom_id"] for o in out] == [f"k-{i}" for i in range(LINES)]
    rows = query(
        "SELECT request_id, status, prompt_tokens, completion_tokens FROM requests WHERE batch_id = ?", [batch_id]
    )
    assert sorted(r[0] for r in rows) == sorted(o["id"] for o in out)  # one row per answered line, and no other
    assert {r[1] for r in rows} == {200}
    assert batch.usage.input_tokens == sum(r[2] for r in rows) == LINES * PROMPT_TOKENS
    assert batch.usage.output_tokens == sum(r[3] for r in rows) == LINES * COMPLETION_TOKENS
    daily = query("SELECT sum(requests), sum(prompt_tokens), sum(completion_tokens) FROM daily", [])
    assert tuple(int(x) for x in daily[0]) == (LINES, LINES * PROMPT_TOKENS, LINES * COMPLETION_TOKENS)


def test_sigterm_finishes_the_lines_in_flight_and_books_no_line_twice(tmp_path: Path, url: str) -> None:
    up = _Upstream()
    up.start()
    query = _query(url)
    try:
        path, gw, batch_id = _start(tmp_path, url, up)
        try:
            _until(query, batch_id, lambda: all(up.seen()[p] for p in HUNG), "the hung lines sent")
            gw.sigterm()
            gw.proc.wait(20)
        finally:
            gw.stop()
        # The lines in flight at the signal were answered within the grace and booked; only the hung ones were
        # cut, and left no row.
        unanswered = query("SELECT custom_id FROM batch_lines WHERE batch_id = ? AND state = 'sent'", [batch_id])
        assert sorted(r[0] for r in unanswered) == ["k-12", "k-13"]
        assert query("SELECT count(*) FROM requests WHERE status <> 200", []) == [(0,)]
        _finish_and_check(path, url, batch_id)
        assert all(n == (2 if p in HUNG else 1) for p, n in up.seen().items())  # no line answered sent again
    finally:
        up.released.set()
        up.stop()


def test_sigkill_loses_no_row_of_a_line_booked(tmp_path: Path, url: str) -> None:
    up = _Upstream()
    up.released.set()  # nothing hangs
    up.start()
    query = _query(url)
    try:
        path, gw, batch_id = _start(tmp_path, url, up)
        try:
            for threshold in (8, 20):
                _until(query, batch_id, functools.partial(_booked, query, batch_id, threshold), "lines booked")
                gw.stop()  # SIGKILL, lines in flight: they are sent again
                assert _completed(query, batch_id) < LINES
                gw = GatewayChild(path, env=cli_env(**ENV))
                gw.wait_ready()
        finally:
            gw.stop()
        _finish_and_check(path, url, batch_id)
    finally:
        up.stop()
