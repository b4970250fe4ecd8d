"""Anthropic end to end: the gateway (uvicorn, real socket) in front of a loopback upstream that replays the
real Messages recordings (tests/fixtures/anthropic, see SOURCES.md); clients are the official `openai` SDK
and raw httpx. The client asks for a legacy completion and gets exactly the recorded text, finish reason
and usage; the upstream sees a Messages request with Anthropic's auth headers."""

from __future__ import annotations

import json

import httpx
import openai

from tests.helpers.clients import sse_data
from tests.helpers.errors import assert_error
from tests.helpers.recordings import fixture_bytes, sse_events
from tests.helpers.upstreams import Upstream, reply, reply_sse

UPSTREAM_KEY = "sk-ant-upstream-e2e"
MODEL = "claude/claude-sonnet-4-5-20250929"
CONFIG = """
unsupported_params: error
retries: {{attempts: 1}}
providers:
  claude:
    kind: anthropic
    api_key: {key}
    base_url: {url}/anthropic
    default_max_tokens: 1024
    models: [claude-sonnet-4-5-20250929]
"""


def _assert_messages_call(upstream: Upstream, body: dict[str, object]) -> None:
    sent = upstream.only()
    assert (sent.method, sent.path, sent.query) == ("POST", "/anthropic/v1/messages", {})
    assert sent.headers["x-api-key"] == UPSTREAM_KEY
    assert sent.headers["anthropic-version"] == "2023-06-01"
    assert "authorization" not in sent.headers
    assert sent.json() == body


def test_openai_sdk_non_stream_stop_sequence_recording(oai: openai.OpenAI, upstream: Upstream) -> None:
    upstream.handler = reply(fixture_bytes("anthropic/messages_stop_sequence.json"))
    completion = oai.completions.create(
        model=MODEL, prompt="What is the capital of France?", max_tokens=50, stop=["Paris"], temperature=0.5
    )
    assert completion.id.startswith("cmpl-")
    assert completion.object == "text_completion"
    assert completion.model == MODEL
    assert [(c.index, c.text, c.finish_reason, c.logprobs) for c in completion.choices] == [
        (0, "The beautiful city of ", "stop", None)
    ]
    assert completion.usage is not None
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens, completion.usage.total_tokens) == (
        32,
        5,
        37,
    )
    assert completion.usage.prompt_tokens_details is not None
    assert completion.usage.prompt_tokens_details.cached_tokens == 0
    _assert_messages_call(
        upstream,
        {
            "model": "claude-sonnet-4-5-20250929",
            "messages": [{"role": "user", "content": "What is the capital of France?"}],
            "max_tokens": 50,
            "temperature": 0.5,
            "stop_sequences": ["Paris"],
        },
    )


def test_openai_sdk_stream_recording_with_usage(oai: openai.OpenAI, upstream: Upstream) -> None:
    upstream.handler = reply_sse(sse_events(fixture_bytes("anthropic/messages_stream.sse.txt")))
    stream = oai.completions.create(
        model=MODEL, prompt="What is 1+1? Answer with the number.", stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    content = [c for c in chunks if c.choices]
    assert "".join(c.choices[0].text for c in content) == "2"
    assert [c.choices[0].finish_reason for c in content] == [None, "stop"]
    assert {c.id for c in chunks} == {chunks[0].id}
    assert {c.model for c in chunks} == {MODEL}
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (20, 5, 25)
    # No max_tokens from the client: the provider's configured default goes upstream.
    _assert_messages_call(
        upstream,
        {
            "model": "claude-sonnet-4-5-20250929",
            "messages": [{"role": "user", "content": "What is 1+1? Answer with the number."}],
            "max_tokens": 1024,
            "stream": True,
        },
    )


def test_raw_stream_without_usage_request_ends_with_done(api: httpx.Client, upstream: Upstream) -> None:
    upstream.handler = reply_sse(sse_events(fixture_bytes("anthropic/messages_stream.sse.txt")))
    resp = api.post("/v1/completions", json={"model": MODEL, "prompt": "1+1?", "stream": True})
    assert resp.status_code == 200, resp.text
    data = sse_data(resp.text)
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert [(c["choices"][0]["text"], c["choices"][0]["finish_reason"]) for c in chunks] == [("2", None), ("", "stop")]
    # The client did not ask for usage: the gateway strips it.
    assert all("usage" not in c for c in chunks)


def test_raw_non_stream_end_turn_recording(api: httpx.Client, upstream: Upstream) -> None:
    upstream.handler = reply(fixture_bytes("anthropic/messages_end_turn.json"))
    resp = api.post("/v1/completions", json={"model": MODEL, "prompt": "What is the capital of France?"})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body == {
        "object": "text_completion",
        "id": body["id"],
        "created": body["created"],
        "model": MODEL,
        "choices": [{"text": "The capital of France is Paris.", "index": 0, "logprobs": None, "finish_reason": "stop"}],
        "usage": {
            "prompt_tokens": 20,
            "completion_tokens": 10,
            "total_tokens": 30,
            "prompt_tokens_details": {"cached_tokens": 0},
        },
    }
    assert resp.headers["x-gateway-provider"] == "claude"
    assert upstream.only().json()["max_tokens"] == 1024


def test_recorded_error_reaches_the_client(api: httpx.Client, upstream: Upstream) -> None:
    upstream.handler = reply(fixture_bytes("anthropic/error_400_invalid_request.json"), status=400)
    resp = api.post("/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 5})
    assert_error(
        resp,
        "/v1/completions",
        status=400,
        type="invalid_request_error",
        message="claude error (400): This model does not support effort level 'xhigh'. "
        "Supported levels: high, low, max, medium.",
        code="invalid_request_error",
    )


def test_temperature_above_one_is_refused_before_any_upstream_call(api: httpx.Client, upstream: Upstream) -> None:
    resp = api.post("/v1/completions", json={"model": MODEL, "prompt": "x", "temperature": 1.5})
    assert_error(
        resp,
        "/v1/completions",
        status=400,
        type="invalid_request_error",
        message="Provider 'claude' accepts 'temperature' from 0 to 1, got 1.5",
        param="temperature",
        code="invalid_value",
    )
    assert upstream.received == []


def test_unsupported_field_is_refused_naming_the_provider(api: httpx.Client, upstream: Upstream) -> None:
    resp = api.post("/v1/completions", json={"model": MODEL, "prompt": "x", "logprobs": 2})
    assert_error(
        resp,
        "/v1/completions",
        status=400,
        type="invalid_request_error",
        message="Parameter 'logprobs' is not supported by provider 'claude'",
        param="logprobs",
        code="unsupported_parameter",
    )
    assert upstream.received == []


def test_n_and_echo_are_emulated_by_fanning_out(api: httpx.Client, upstream: Upstream) -> None:
    upstream.handler = reply(fixture_bytes("anthropic/messages_end_turn.json"))
    prompt = "What is the capital of France? "
    resp = api.post("/v1/completions", json={"model": MODEL, "prompt": prompt, "n": 2, "echo": True})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["choices"] == [
        {"text": prompt + "The capital of France is Paris.", "index": i, "logprobs": None, "finish_reason": "stop"}
        for i in range(2)
    ]
    assert body["usage"] == {
        "prompt_tokens": 40,
        "completion_tokens": 20,
        "total_tokens": 60,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    # Two plain Messages calls: neither n nor echo reaches Anthropic.
    assert [r.json() for r in upstream.received] == [
        {
            "model": "claude-sonnet-4-5-20250929",
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 1024,
        }
    ] * 2
