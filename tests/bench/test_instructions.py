"""`python -m bench.instructions` runs: its Python-level count works on every path, without valgrind.

The callgrind count itself takes minutes and needs valgrind, so only the in-process driver it runs is
exercised here, with a few requests: real ASGI app, real pipeline, a real loopback upstream for `h1`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from bench import inprocess, instructions
from bench.processes import free_port
from bench.upstream import CHAT, COMPLETION, chat_stream_events, stream_events
from tests.helpers.sqlite import opened


@pytest.fixture(scope="module")
def upstream() -> Iterator[Any]:
    service = inprocess.start_upstream(chunks=3)
    try:
        yield service
    finally:
        service.stop()


@pytest.mark.parametrize("path", inprocess.PATHS)
def test_calls_per_request(path: str, upstream: Any) -> None:
    port = upstream.port if inprocess.needs_upstream(path) else None
    figures = instructions.count_calls(path, requests=8, warmup=2, upstream_port=port)
    # A completion runs hundreds of Python functions; a count near zero would mean nothing was measured.
    assert figures["python_calls"] > 50
    assert figures["c_calls"] > 50


def test_chat_is_measured_on_the_completions_twin() -> None:
    # The chat paths are compared with the completion ones: the upstream's answers must be of the same size.
    assert CHAT["usage"] == COMPLETION["usage"]
    assert CHAT["choices"][0]["message"]["content"] == COMPLETION["choices"][0]["text"]  # type: ignore[index]
    for chunks in (1, 3, 20):
        assert len(chat_stream_events(chunks)) == len(stream_events(chunks))
    assert b'"role":"assistant"' in chat_stream_events(3)[0]
    assert b'"finish_reason":"length"' in chat_stream_events(3)[-2]


@pytest.mark.parametrize(("chat", "completion"), [("chat", "h1"), ("chat-stream", "h1-stream")])
def test_a_chat_request_makes_no_more_calls_than_a_completion(chat: str, completion: str, upstream: Any) -> None:
    # Chat shares the completion's request path; what it adds (its decode, the conversation's checks and
    # rendering, the chat route's mapping and parsing) must not cost calls of its own per request. A few
    # calls of slack for the timers (the access log's flush) that fall on one run's requests and not the other's.
    counted = {
        p: instructions.count_calls(p, requests=60, warmup=5, upstream_port=upstream.port) for p in (chat, completion)
    }
    assert counted[chat]["python_calls"] <= counted[completion]["python_calls"] + 2, counted
    assert counted[chat]["c_calls"] <= counted[completion]["c_calls"] + 2, counted


def test_chat_requests_go_to_the_chat_route() -> None:
    body = msgspec.json.decode(inprocess.request_body("chat-stream", 7))
    assert body["messages"] == [{"role": "user", "content": "Say hello 0000007"}]
    assert "prompt" not in body and body["stream"] is True
    assert inprocess.scope_of(b"{}", "/v1/chat/completions")["raw_path"] == b"/v1/chat/completions"


def test_a_failed_request_stops_the_run() -> None:
    # No upstream listens on this port: the driver must not count requests that did not complete.
    with pytest.raises(RuntimeError, match="request 0 on h1: 50"):
        instructions.count_calls("h1", requests=2, warmup=0, upstream_port=free_port())


def test_command_line_writes_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "calls.json"
    assert (
        instructions.main(
            ["--count", "calls", "--paths", "fake", "--requests", "5", "--warmup", "1", "--json", str(out)]
        )
        == 0
    )
    assert "Python calls/request" in capsys.readouterr().out
    assert json.loads(out.read_text())["fake"]["python_calls"] > 50


def test_unknown_path_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        instructions.parse_args(["--paths", "fake,h2"])
    assert "--paths: unknown path 'h2'" in capsys.readouterr().err


def test_concurrent_clients_send_every_request(upstream: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # `--concurrency`: the requests shared among clients that send at once, each one answered.
    monkeypatch.setenv("BENCH_CONCURRENCY", "4")
    figures = instructions.count_calls("h1", requests=10, warmup=3, upstream_port=upstream.port)
    assert figures["python_calls"] > 50
    with pytest.raises(RuntimeError, match="on h1: 50"):
        instructions.count_calls("h1", requests=4, warmup=0, upstream_port=free_port())


def test_the_ledgers_schema_is_made_before_the_measured_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Were the N1 run the first on a new database, it alone would pay for creating it, and (N2 - N1) would
    # take that off the ledger's cost per request.
    db = tmp_path / "ledger.db"
    monkeypatch.setenv("BENCH_LEDGER_URL", f"sqlite:///{db}")
    instructions.prime_ledger("fake", None, ["--cache", "off", "--stops", "none"])
    with opened(db) as conn:
        assert conn.execute("SELECT count(*) FROM requests").fetchone() == (1,)
