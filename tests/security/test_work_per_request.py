"""Work one request can make the gateway do when it enforces stops and checks guided JSON itself.

Over real sockets: the gateway under uvicorn, a loopback upstream answering as Ollama (stops kept with
`include_stop_str_in_output`, enforced by the gateway) and as Anthropic (`guided_json` checked by the
gateway). While the request runs, `/health` is polled on its own connection: the worker's event loop
must keep answering within 100 ms.

- Stops: the stream scanner was rebuilt on every chunk and ran one automaton per stop over every chunk
  (64 stops of 4,096 characters froze a worker for about 10 s). Now one automaton for all stops is
  built once per request, and the stops the gateway enforces are held to `caps.stop_chars` together.
- Guided JSON: every answer of every choice and retry had its own budget of keyword evaluations, and a
  schema of chained `anyOf`/`$ref` pairs (2^30 paths) was admitted. Now a schema's `$ref`/applicator
  paths are counted at admission (`caps.schema_paths`), and one budget (`caps.guided_work`) and the
  request's deadline bound all of a request's checks.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
from aiohttp import web

from tests.helpers.clients import sse_data
from tests.helpers.recordings import fixture_json
from tests.helpers.upstreams import Handler, Received, Upstream

from .conftest import HealthProbe, answering, timed_post

HEALTH_S = 0.1
OLLAMA = "ollama/llama3"
ANTHROPIC = "anthropic/claude-3-opus-20240229"


def ollama_stream(pieces: list[str]) -> Handler:
    """Ollama's NDJSON stream: one line per piece, then its final line."""
    last: dict[str, Any] = fixture_json("ollama/generate_nonstream.json")
    last.update(response="", done=True)

    async def handler(request: web.Request, received: Received) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"content-type": "application/x-ndjson"})
        await resp.prepare(request)
        for piece in pieces:
            await resp.write(json.dumps({"model": "llama3", "response": piece, "done": False}).encode() + b"\n")
        await resp.write(json.dumps(last).encode() + b"\n")
        await resp.write_eof()
        return resp

    return handler


def _streamed_text(resp: httpx.Response) -> tuple[str, list[str | None]]:
    assert resp.status_code == 200, resp.text[:500]
    events = sse_data(resp.text)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    choices = [ch for c in chunks for ch in c["choices"]]
    return "".join(ch["text"] for ch in choices), [ch["finish_reason"] for ch in choices if ch["finish_reason"]]


def _stops(count: int, length: int) -> list[str]:
    """`count` stops of `length` characters that a text of `a`s keeps almost matching."""
    return ["a" * (length - 1) + chr(0x100 + i) for i in range(count)]


def stop_body(stops: list[str]) -> dict[str, Any]:
    return {
        "model": OLLAMA,
        "prompt": "a's",
        "max_tokens": 100_000,
        "stream": True,
        "stop": stops,
        "include_stop_str_in_output": True,
    }


def test_enforced_stops_beyond_stop_chars_are_refused_naming_stop(api: httpx.Client, upstream: Upstream) -> None:
    # The request: 64 stops of 4,096 characters (each within caps.pattern_chars).
    upstream.handler = ollama_stream(["a" * 100] * 10)
    resp, took = timed_post(api, "/v1/completions", stop_body(_stops(64, 4096)))
    assert resp.status_code == 400, resp.text[:500]
    error = resp.json()["error"]
    assert (error["param"], error["code"], error["type"]) == ("stop", "invalid_value", "invalid_request_error")
    assert "at most 8192 characters together" in error["message"]
    assert upstream.received == []
    assert took < 1.0, took


def test_stops_at_the_cap_scan_large_chunks_while_the_loop_keeps_answering(
    gateway: Any, api: httpx.Client, upstream: Upstream
) -> None:
    # 64 stops of 128 characters (8,192 together) and chunks of 32,768 `a`s: one automaton per stop
    # took about 0.4 s of the event loop per chunk.
    stops = _stops(64, 128)
    pieces = ["a" * 32_768] * 24 + ["a" * 200 + stops[37][-1] + " after the stop"]
    upstream.handler = ollama_stream(pieces)
    with HealthProbe(gateway.url) as probe:
        resp, took = timed_post(api, "/v1/completions", stop_body(stops))
    text, finishes = _streamed_text(resp)
    assert text == "a" * (32_768 * 24 + 200) + stops[37][-1]
    assert finishes == ["stop"]
    assert took < 5.0, took
    assert probe.answers > 0 and probe.slowest < HEALTH_S, (probe.answers, probe.slowest)


def test_stops_at_the_cap_are_built_once_not_per_chunk(gateway: Any, api: httpx.Client, upstream: Upstream) -> None:
    # Two stops of 4,096 characters, 4,000 chunks of eight characters: rebuilding the stops' automata on
    # every chunk cost milliseconds per chunk.
    stops = _stops(2, 4096)
    pieces = ["bbbbaaaa"] * 4000 + ["a" * 4095 + stops[1][-1]]
    upstream.handler = ollama_stream(pieces)
    with HealthProbe(gateway.url) as probe:
        resp, took = timed_post(api, "/v1/completions", stop_body(stops))
    text, finishes = _streamed_text(resp)
    assert text == "bbbbaaaa" * 4000 + stops[1]
    assert finishes == ["stop"]
    assert took < 3.0, took
    assert probe.answers > 0 and probe.slowest < HEALTH_S, (probe.answers, probe.slowest)


def test_enforced_stops_cut_a_buffered_answer(api: httpx.Client, upstream: Upstream) -> None:
    stops = _stops(64, 128)
    upstream.handler = answering("a" * 300_000 + stops[5][-1] + "tail")
    body = stop_body(stops) | {"stream": False}
    resp, took = timed_post(api, "/v1/completions", body)
    assert resp.status_code == 200, resp.text[:500]
    choice = resp.json()["choices"][0]
    assert (choice["text"], choice["finish_reason"]) == ("a" * 300_000 + stops[5][-1], "stop")
    assert took < 3.0, took
