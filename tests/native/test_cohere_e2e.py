"""Cohere end to end: the gateway (uvicorn, real socket) in front of a loopback upstream. The non-stream
test replays the real v2 chat recording (tests/fixtures/cohere, see SOURCES.md). No Cohere stream was
recorded: the stream test replays events built only from the documented shape (docs.cohere.com/v2/docs/
streaming; cohere-python `v2/types/v2chat_stream_response.py`), so it checks the relay, not Cohere's wire."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai

from tests.helpers.errors import assert_error
from tests.helpers.recordings import fixture_bytes
from tests.helpers.upstreams import Upstream, reply, reply_sse

UPSTREAM_KEY = "co-upstream-e2e"
MODEL = "co/command-r7b-12-2024"
CONFIG = """
unsupported_params: error
retries: {{attempts: 1}}
providers:
  co:
    kind: cohere
    api_key: {key}
    base_url: {url}/cohere
    models: [command-r7b-12-2024]
"""


def documented_event(kind: str, **fields: Any) -> bytes:
    """One SSE event in the documented shape (not a recording): `event:` name plus JSON with `type`."""
    return f"event: {kind}\n".encode() + b"data: " + json.dumps({"type": kind, **fields}).encode()


DOCUMENTED_STREAM = [
    documented_event("message-start", id="msg-1", delta={"message": {"role": "assistant"}}),
    documented_event("content-start", index=0, delta={"message": {"content": {"type": "text", "text": ""}}}),
    documented_event("content-delta", index=0, delta={"message": {"content": {"text": "Paris is"}}}),
    documented_event("content-delta", index=0, delta={"message": {"content": {"text": " the capital."}}}),
    documented_event("content-end", index=0),
    documented_event(
        "message-end",
        id="msg-1",
        delta={
            "finish_reason": "COMPLETE",
            "usage": {
                "billed_units": {"input_tokens": 8, "output_tokens": 5},
                "tokens": {"input_tokens": 74, "output_tokens": 6},
            },
        },
    ),
]


def _assert_chat_call(upstream: Upstream, body: dict[str, object]) -> None:
    sent = upstream.only()
    assert (sent.method, sent.path, sent.query) == ("POST", "/cohere/v2/chat", {})
    assert sent.headers["authorization"] == f"Bearer {UPSTREAM_KEY}"
    assert sent.json() == body


def test_openai_sdk_non_stream_recording(oai: openai.OpenAI, upstream: Upstream) -> None:
    upstream.handler = reply(fixture_bytes("cohere/v2_chat_stop_sequence.json"))
    completion = oai.completions.create(
        model=MODEL, prompt="What is the capital of France?", max_tokens=20, stop=["Paris"], top_p=0.5
    )
    assert completion.id.startswith("cmpl-")
    assert completion.model == MODEL
    assert [(c.index, c.text, c.finish_reason, c.logprobs) for c in completion.choices] == [
        (0, "The capital of France is a city known as", "stop", None)
    ]
    assert completion.usage is not None
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens, completion.usage.total_tokens) == (
        25,
        9,
        34,
    )
    _assert_chat_call(
        upstream,
        {
            "model": "command-r7b-12-2024",
            "messages": [{"role": "user", "content": "What is the capital of France?"}],
            "max_tokens": 20,
            "p": 0.5,
            "stop_sequences": ["Paris"],
        },
    )


def test_openai_sdk_stream_of_documented_events(oai: openai.OpenAI, upstream: Upstream) -> None:
    upstream.handler = reply_sse(DOCUMENTED_STREAM)
    chunks = list(
        oai.completions.create(
            model=MODEL, prompt="Capital of France?", stream=True, stream_options={"include_usage": True}
        )
    )
    content = [c for c in chunks if c.choices]
    assert [c.choices[0].text for c in content] == ["Paris is", " the capital.", ""]
    assert [c.choices[0].finish_reason for c in content] == [None, None, "stop"]
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (8, 5, 13)
    _assert_chat_call(
        upstream,
        {
            "model": "command-r7b-12-2024",
            "messages": [{"role": "user", "content": "Capital of France?"}],
            "stream": True,
        },
    )


def test_rate_limit_reaches_the_client_as_429(api: httpx.Client, upstream: Upstream) -> None:
    body = json.dumps({"message": "You are past the per minute request limit, please wait and try again later."})
    upstream.handler = reply(body.encode(), status=429, headers={"retry-after": "2"})
    resp = api.post("/v1/completions", json={"model": MODEL, "prompt": "x"})
    assert_error(
        resp,
        "/v1/completions",
        status=429,
        type="rate_limit_error",
        message="co error (429): You are past the per minute request limit, please wait and try again later.",
        code="upstream_http_429",
    )
    assert len(upstream.received) == 1


def test_out_of_range_top_p_is_refused_before_any_upstream_call(api: httpx.Client, upstream: Upstream) -> None:
    resp = api.post("/v1/completions", json={"model": MODEL, "prompt": "x", "top_p": 1.0})
    assert_error(
        resp,
        "/v1/completions",
        status=400,
        type="invalid_request_error",
        message="Provider 'co' accepts 'top_p' from 0.01 to 0.99, got 1",
        param="top_p",
        code="invalid_value",
    )
    assert upstream.received == []


def test_include_stop_str_in_output_is_enforced_by_the_gateway(api: httpx.Client, upstream: Upstream) -> None:
    upstream.handler = reply(fixture_bytes("cohere/v2_chat_stop_sequence.json"))
    resp = api.post(
        "/v1/completions",
        json={"model": MODEL, "prompt": "Capital of France?", "stop": ["city"], "include_stop_str_in_output": True},
    )
    assert resp.status_code == 200, resp.text
    assert resp.json()["choices"] == [
        {"text": "The capital of France is a city", "index": 0, "logprobs": None, "finish_reason": "stop"}
    ]
    # The gateway stops on it (keeping the string): Cohere would have cut it off, so it is not sent.
    _assert_chat_call(
        upstream,
        {"model": "command-r7b-12-2024", "messages": [{"role": "user", "content": "Capital of France?"}]},
    )
