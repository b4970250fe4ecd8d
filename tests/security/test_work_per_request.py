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
import pytest
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
    # The issue's request: 64 stops of 4,096 characters (each within caps.pattern_chars).
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
    # The loop relays 24 lines of 32 KiB (800 KB) to a client in this process while the probe runs: on a
    # 2-core machine that alone delays /health past HEALTH_S now and then (a slice's scan takes about 1 ms).
    # One automaton per stop took 0.4 s of the loop per chunk.
    assert probe.answers > 0 and probe.slowest < 2.5 * HEALTH_S, (probe.answers, probe.slowest)


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


# --------------------------------------------------------------------------------------------------
# Guided JSON


def _chained(pairs: int) -> dict[str, Any]:
    """`pairs` levels of `anyOf` whose two branches `$ref` the next level: 2^(pairs-1) paths for one value."""
    defs: dict[str, Any] = {
        f"d{i}": {"anyOf": [{"$ref": f"#/$defs/d{i + 1}"}, {"$ref": f"#/$defs/d{i + 1}", "minimum": 0}]}
        for i in range(pairs)
    }
    defs[f"d{pairs}"] = {"type": "integer"}
    return {"$defs": defs, "$ref": "#/$defs/d0"}


# Every item matches only the last of eight branches: nine evaluations per item, 900,000 per answer.
COSTLY = {
    "type": "array",
    "items": {
        "anyOf": [{"type": t} for t in ("integer", "string", "object", "array", "null", "number")] * 1
        + [
            {"type": "array"},
            {"type": "boolean"},
        ]
    },
}
COSTLY_ANSWER = json.dumps([True] * 100_000)


def guided(schema: dict[str, Any], n: int, **extra: Any) -> dict[str, Any]:
    return {"model": ANTHROPIC, "prompt": "json", "max_tokens": 40, "n": n, "guided_json": schema, **extra}


def test_a_schema_with_exponentially_many_ref_paths_is_refused_naming_guided_json(
    gateway: Any, api: httpx.Client, upstream: Upstream
) -> None:
    # The issue's schema: 31 chained anyOf/$ref pairs (2^30 paths); n: 4 took 30 s of checking.
    upstream.handler = answering('"not an integer"')
    with HealthProbe(gateway.url) as probe:
        resp, took = timed_post(api, "/v1/completions", guided(_chained(31), 4))
    assert resp.status_code == 400, resp.text[:500]
    error = resp.json()["error"]
    assert (error["param"], error["code"], error["type"]) == ("guided_json", "invalid_value", "invalid_request_error")
    assert "more than 1000 ways through its '$ref'" in error["message"]
    assert upstream.received == []
    assert took < 1.0, took
    assert probe.slowest < HEALTH_S, probe.slowest


def test_a_schema_with_few_ref_paths_is_still_checked(api: httpx.Client, upstream: Upstream) -> None:
    upstream.handler = answering("7")
    resp, _ = timed_post(api, "/v1/completions", guided(_chained(6), 2))
    assert resp.status_code == 200, resp.text[:500]
    assert [c["text"] for c in resp.json()["choices"]] == ["7", "7"]


def test_one_checking_budget_is_shared_by_every_choice_and_retry(
    gateway: Any, api: httpx.Client, upstream: Upstream
) -> None:
    # Eight choices, each answer needing 900,000 evaluations: the answers had 100,000 each, for each of
    # three attempts (24 s of checking); the request now has caps.guided_work (200,000) in all.
    upstream.handler = answering(COSTLY_ANSWER)
    # One choice spends the whole budget on its one answer: what the eight together may spend, on this machine.
    one, alone = timed_post(api, "/v1/completions", guided(COSTLY, 1))
    assert one.status_code == 502 and len(upstream.received) == 1, one.text[:500]
    upstream.received.clear()
    with HealthProbe(gateway.url) as probe:
        resp, took = timed_post(api, "/v1/completions", guided(COSTLY, 8))
    assert resp.status_code == 502, resp.text[:500]
    error = resp.json()["error"]
    assert (error["param"], error["code"]) == ("guided_json", "guided_output_invalid")
    assert "more than the gateway's bound of 200000 evaluations" in error["message"]
    assert len(upstream.received) == 8  # the first call of each choice; no retry once the budget is spent
    # A budget per answer would check twelve times what one choice checks; the eight answers' decoding aside.
    assert took < 3 * alone + 1.0, (took, alone)
    # The loop itself receives and decodes the eight 600 KB answers (4.8 MB) while the probe runs: on a
    # 2-core machine that alone delays /health past HEALTH_S now and then. Checking on the loop took seconds.
    assert probe.answers > 0 and probe.slowest < 2.5 * HEALTH_S, (probe.answers, probe.slowest)


def test_checking_stops_at_the_requests_deadline(gateway: Any, api: httpx.Client, upstream: Upstream) -> None:
    upstream.handler = answering(COSTLY_ANSWER)
    with HealthProbe(gateway.url) as probe:
        resp, took = timed_post(api, "/v1/completions", guided(COSTLY, 2, inference_timeout=0.5))
    assert resp.status_code == 504, resp.text[:500]
    assert resp.json()["error"]["code"] == "deadline_exceeded"
    assert took < 1.5, took
    assert probe.answers > 0 and probe.slowest < HEALTH_S, (probe.answers, probe.slowest)


def _wide(count: int, broken: bool = False) -> dict[str, Any]:
    """A schema of `count` properties: checking it against its meta-schema takes about 0.25 s per 1,000."""
    props: dict[str, Any] = {f"p{i}": {"type": "string", "minLength": 1, "maxLength": 10} for i in range(count)}
    if broken:
        props[f"p{count - 1}"] = {"type": "strnig"}
    return {"type": "object", "properties": props}


def test_a_large_schema_is_admitted_off_the_event_loop(gateway: Any, api: httpx.Client, upstream: Upstream) -> None:
    # Admitting a schema of 1,200 properties held the event loop for about 0.3 s per attempt.
    upstream.handler = answering('{"p1": "ok"}')
    with HealthProbe(gateway.url) as probe:
        for _ in range(4):
            resp, _ = timed_post(api, "/v1/completions", guided(_wide(1200), 1))
            assert resp.status_code == 200, resp.text[:500]
    assert probe.answers > 0 and probe.slowest < HEALTH_S, (probe.answers, probe.slowest)


def test_a_large_invalid_schema_is_still_refused_before_the_upstream(api: httpx.Client, upstream: Upstream) -> None:
    upstream.handler = answering("{}")
    resp, _ = timed_post(api, "/v1/completions", guided(_wide(1000, broken=True), 1))
    assert resp.status_code == 400, resp.text[:500]
    error = resp.json()["error"]
    assert (error["param"], error["code"]) == ("guided_json", "invalid_value")
    assert error["message"].startswith("'guided_json' is not a valid JSON Schema")
    assert upstream.received == []


@pytest.mark.parametrize("dialect", [5, 1.5, True, [], {}])
def test_a_schema_whose_dialect_is_not_a_string_is_refused_naming_guided_json(
    api: httpx.Client, upstream: Upstream, dialect: Any
) -> None:
    upstream.handler = answering("{}")
    resp = api.post("/v1/completions", json=guided({"$schema": dialect, "type": "object"}, 1))
    assert resp.status_code == 400, resp.text[:500]
    error = resp.json()["error"]
    assert (error["param"], error["code"]) == ("guided_json", "invalid_value")
    assert "$schema" in error["message"]
    assert upstream.received == []
