"""Each route's own request rules and stream usage, as its seed states them, over real HTTP.

PAIS (seed 004) defaults `temperature` to 0 and bounds `max_tokens` and `stop`; SGP (seed 003) bounds
`top_logprobs` to 0..20; Fireworks (seed 001) sends a stream's usage on its very last chunk unasked. The
loopback upstream records what each request sent, so both sides are checked.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.helpers.clients import sse_data
from tests.helpers.errors import PAIS_ROUTE, SGP_ROUTE, assert_error
from tests.helpers.recordings import fixture_bytes, sse_events
from tests.helpers.upstreams import Upstream, reply, reply_sse

DAVINCI = "openai/completion_davinci002.json"
FIREWORKS_CHAT = "fireworks/chat_stream_via_hf_router.sse.txt"
FW_MODEL = "fireworks/accounts/fireworks/models/llama-v3p1-8b-instruct"
USAGE = {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}


def _req(**fields: Any) -> dict[str, Any]:
    return {"model": "openai/davinci-002", "prompt": "Say this is a test", **fields}


# -- PAIS: temperature's default and the schema's bounds --------------------------------------------


def test_pais_sends_temperature_0_when_the_client_sends_none(api: httpx.Client, upstream: Upstream) -> None:
    upstream.handler = reply(fixture_bytes(DAVINCI))
    resp = api.post(PAIS_ROUTE, json=_req(max_tokens=7))
    assert resp.status_code == 200, resp.text
    assert upstream.only().json()["temperature"] == 0
    upstream.received.clear()
    kept = api.post(PAIS_ROUTE, json=_req(max_tokens=7, temperature=0.7))
    assert kept.status_code == 200, kept.text
    assert upstream.only().json()["temperature"] == 0.7
    upstream.received.clear()
    # OpenAI's route leaves it to the upstream's default, as OpenAI does.
    plain = api.post("/v1/completions", json=_req(max_tokens=7))
    assert plain.status_code == 200, plain.text
    assert "temperature" not in upstream.only().json()


@pytest.mark.parametrize(
    ("fields", "param", "message"),
    [
        ({"max_tokens": 0}, "max_tokens", "Invalid value for 'max_tokens': Expected `int` >= 1"),
        ({"stop": []}, "stop", "Invalid value for 'stop': Expected `array` of length >= 1"),
    ],
    ids=["max-tokens-0", "empty-stop-list"],
)
def test_pais_refuses_what_its_schema_bounds(
    api: httpx.Client, upstream: Upstream, fields: dict[str, Any], param: str, message: str
) -> None:
    upstream.handler = reply(fixture_bytes(DAVINCI))
    resp = api.post(PAIS_ROUTE, json=_req(**fields))
    assert_error(
        resp, PAIS_ROUTE, status=400, type="invalid_request_error", param=param, code="invalid_value", message=message
    )
    assert upstream.received == []


# -- SGP: top_logprobs is an integer between 0 and 20 ----------------------------------------------


def test_sgp_refuses_top_logprobs_over_20_as_a_range_error(api: httpx.Client, upstream: Upstream) -> None:
    # vLLM's own bound is its configured `max_logprobs`: the route's bound is SGP's, whatever the provider.
    resp = api.post(SGP_ROUTE, json=_req(model="vllm/facebook/opt-125m", logprobs=True, top_logprobs=21))
    assert_error(
        resp,
        SGP_ROUTE,
        status=400,
        type="invalid_request_error",
        param="top_logprobs",
        code="invalid_value",
        message="Invalid value for 'top_logprobs': Expected `int` <= 20",
    )
    assert upstream.received == []


# -- Fireworks: a stream's usage on its very last chunk --------------------------------------------


def _chunk(text: str, finish: str | None, usage: dict[str, int] | None = None) -> bytes:
    choice = {"text": text, "index": 0, "logprobs": None, "finish_reason": finish}
    body = {"id": "c", "object": "text_completion", "created": 1, "model": "m", "choices": [choice], "usage": usage}
    return b"data: " + json.dumps(body).encode()


def _completion_stream(api: httpx.Client, upstream: Upstream, route: str, **extra: Any) -> list[dict[str, Any]]:
    upstream.handler = reply_sse([_chunk(" a", None), _chunk(" b", "length", USAGE), b"data: [DONE]"])
    resp = api.post(route, json={"model": FW_MODEL, "prompt": "hi", "max_tokens": 2, "stream": True, **extra})
    assert resp.status_code == 200, resp.text
    events = sse_data(resp.text)
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def test_fireworks_route_streams_usage_on_the_last_chunk(api: httpx.Client, upstream: Upstream) -> None:
    chunks = _completion_stream(api, upstream, "/inference/v1/completions")
    assert [c["choices"][0]["text"] for c in chunks] == [" a", " b"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["usage"] == USAGE
    assert all(c.get("usage") is None for c in chunks[:-1])


def test_openai_route_streams_usage_only_when_asked(api: httpx.Client, upstream: Upstream) -> None:
    chunks = _completion_stream(api, upstream, "/v1/completions")
    assert all(c.get("usage") is None for c in chunks)
    asked = _completion_stream(api, upstream, "/v1/completions", stream_options={"include_usage": True})
    assert (asked[-1]["choices"], asked[-1]["usage"]) == ([], USAGE)
    # Asked on Fireworks' route, the usage chunk is OpenAI's, as on /v1/completions.
    fw = _completion_stream(api, upstream, "/inference/v1/completions", stream_options={"include_usage": True})
    assert (fw[-1]["choices"], fw[-1]["usage"]) == ([], USAGE)
    assert all(c.get("usage") is None for c in fw[:-1])


def test_fireworks_chat_route_mirrors_the_recorded_stream(api: httpx.Client, upstream: Upstream) -> None:
    upstream.handler = reply_sse(sse_events(fixture_bytes(FIREWORKS_CHAT)))
    model = "fireworks/accounts/fireworks/models/llama-v3p3-70b-instruct"
    body = {"model": model, "messages": [{"role": "user", "content": "Deep learning?"}], "stream": True}
    resp = api.post("/inference/v1/chat/completions", json=body)
    assert resp.status_code == 200, resp.text
    events = sse_data(resp.text)
    chunks = [json.loads(e) for e in events[:-1]]
    # As recorded: the finish chunk is the last, and carries the usage.
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["usage"] == {"prompt_tokens": 46, "completion_tokens": 20, "total_tokens": 66}
    assert all(c.get("usage") is None for c in chunks[:-1])
