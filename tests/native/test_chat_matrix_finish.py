"""The chat matrix's finish reasons and usage details, as OpenAI names them, from each kind's recordings
(tests/fixtures/SOURCES.md, "Chat matrix").
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.helpers.clients import sse_data
from tests.helpers.recordings import fixture_bytes, fixture_json, sse_events
from tests.helpers.upstreams import Upstream, reply_sse
from tests.native import chat_matrix_setup
from tests.native.chat_matrix_setup import MESSAGES, MODEL, kind_handler

# The gateway fixture (tests/native/conftest.py) reads these from the test module.
CONFIG, GATEWAY_ENV = chat_matrix_setup.CONFIG, chat_matrix_setup.GATEWAY_ENV

# --- finish reasons and usage details -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "rel", "extra", "content", "finish"),
    [
        # Azure's filtered answer carries no message at all.
        ("azure", "azure/chat_finish_reason_content_filter.json", {}, None, "content_filter"),
        ("mistral", "mistral/chat_with_ratelimit_headers.json", {}, "Here's a light-hearted", "stop"),
        ("openai", "openai/chat_o3mini_stop_sequence.json", {"stop": ["Paris"]}, "The capital of France is ", "stop"),
        ("anthropic", "anthropic/messages_stop_sequence.json", {"stop": ["Paris"]}, "The beautiful city of ", "stop"),
        ("bedrock", "bedrock/converse_max_tokens.json", {"max_tokens": 5}, "The capital of France is", "length"),
        ("cohere", "cohere/v2_chat_stop_sequence.json", {"stop": ["Paris"]}, "The capital of France is", "stop"),
    ],
    ids=[
        "azure-content_filter",
        "mistral-stop",
        "openai-stop",
        "anthropic-stop_sequence",
        "bedrock-max_tokens",
        "cohere-stop",
    ],
)
def test_finish_reason(
    api: httpx.Client, upstream: Upstream, kind: str, rel: str, extra: dict[str, Any], content: str | None, finish: str
) -> None:

    upstream.handler = kind_handler(rel)
    resp = api.post("/v1/chat/completions", json={"model": MODEL[kind], "messages": MESSAGES, **extra})
    assert resp.status_code == 200, resp.text
    (choice,) = resp.json()["choices"]
    assert choice["finish_reason"] == finish
    if content is None:
        assert choice["message"]["content"] is None
    else:
        assert choice["message"]["content"].startswith(content)


def test_usage_details_reach_the_client(api: httpx.Client, upstream: Upstream) -> None:
    """Reasoning tokens (OpenAI's o-series) and tokens read from the provider's prompt cache (Bedrock's
    `cacheReadInputTokens`) keep their place in OpenAI's usage."""
    recorded = fixture_json("openai/chat_o3mini_stop_sequence.json")["usage"]
    upstream.handler = kind_handler("openai/chat_o3mini_stop_sequence.json")
    usage = api.post("/v1/chat/completions", json={"model": MODEL["openai"], "messages": MESSAGES}).json()["usage"]
    assert (
        usage["completion_tokens_details"]["reasoning_tokens"]
        == recorded["completion_tokens_details"]["reasoning_tokens"]
    )
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (
        recorded["prompt_tokens"],
        recorded["completion_tokens"],
    )

    cached = fixture_json("bedrock/converse_cache_read.json")["usage"]
    upstream.handler = kind_handler("bedrock/converse_cache_read.json")
    usage = api.post("/v1/chat/completions", json={"model": MODEL["bedrock"], "messages": MESSAGES}).json()["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] == cached["cacheReadInputTokens"]


@pytest.mark.parametrize(
    ("kind", "rel", "cached"),
    [
        # OpenAI's own `prompt_tokens_details`, passed on.
        ("openai", "openai/chat_json_schema.json", lambda u: u["prompt_tokens_details"]["cached_tokens"]),
        ("anthropic", "anthropic/messages_end_turn.json", lambda u: u["cache_read_input_tokens"]),
        ("cohere", "cohere/v2_chat_tool_call.json", lambda u: u["cached_tokens"]),
    ],
    ids=["openai", "anthropic", "cohere"],
)
def test_cached_prompt_tokens_where_the_provider_reports_them(
    api: httpx.Client, upstream: Upstream, kind: str, rel: str, cached: Callable[[dict[str, Any]], int]
) -> None:
    want = cached(fixture_json(rel)["usage"])
    upstream.handler = kind_handler(rel)
    resp = api.post("/v1/chat/completions", json={"model": MODEL[kind], "messages": MESSAGES})
    assert resp.status_code == 200, resp.text
    assert resp.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == want


REFUSAL = "openai/chat_refusal_docs.json"


def test_a_refusal_reaches_the_client(api: httpx.Client, upstream: Upstream) -> None:
    """The model's refusal (OpenAI's documented answer, tests/fixtures/SOURCES.md) is `message.refusal`, with
    no content, as the SDKs' `parse` helpers read it."""
    recorded = fixture_json(REFUSAL)["choices"][0]
    upstream.handler = kind_handler(REFUSAL)
    body = {"model": MODEL["openai"], "messages": MESSAGES, "response_format": {"type": "json_object"}}
    resp = api.post("/v1/chat/completions", json=body)
    assert resp.status_code == 200, resp.text
    (choice,) = resp.json()["choices"]
    assert choice["message"] == {"role": "assistant", "content": None, "refusal": recorded["message"]["refusal"]}
    assert choice["finish_reason"] == "stop"


def test_a_streamed_refusal_reaches_the_client_in_its_pieces(api: httpx.Client, upstream: Upstream) -> None:
    """`delta.refusal` pieces (OpenAI's chunk shape) are relayed as they come, after the role chunk."""
    text = fixture_json(REFUSAL)["choices"][0]["message"]["refusal"]
    pieces = [text[:7], text[7:20], text[20:]]
    head = {"id": "chatcmpl-r", "object": "chat.completion.chunk", "created": 1721596428, "model": "gpt-4o"}

    def event(choices: list[Any], **more: Any) -> bytes:
        return b"data: " + json.dumps(head | {"choices": choices} | more).encode()

    events = [event([{"index": 0, "delta": {"role": "assistant", "refusal": ""}, "finish_reason": None}])]
    events += [event([{"index": 0, "delta": {"refusal": p}, "finish_reason": None}]) for p in pieces]
    events.append(event([{"index": 0, "delta": {}, "finish_reason": "stop"}]))
    events.append(event([], usage={"prompt_tokens": 81, "completion_tokens": 11, "total_tokens": 92}))
    events.append(b"data: [DONE]")
    upstream.handler = reply_sse(events)
    body = {"model": MODEL["openai"], "messages": MESSAGES, "stream": True, "stream_options": {"include_usage": True}}
    resp = api.post("/v1/chat/completions", json=body)
    assert resp.status_code == 200, resp.text
    data = sse_data(resp.text)
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    got = [c["choices"][0]["delta"].get("refusal") for c in chunks if c["choices"]]
    assert [g for g in got if g] == pieces
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "stop"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] == 92


def test_anthropic_error_event_mid_stream(api: httpx.Client, upstream: Upstream) -> None:
    """Anthropic's `event: error` after the stream started (its documented `overloaded_error`): the text so
    far, then the error event in OpenAI's envelope, then [DONE]."""
    events = sse_events(fixture_bytes("anthropic/messages_stream.sse.txt"))[:4]  # through the first text delta
    events.append(b'event: error\ndata: {"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}')
    upstream.handler = reply_sse(events)
    resp = api.post("/v1/chat/completions", json={"model": MODEL["anthropic"], "messages": MESSAGES, "stream": True})
    assert resp.status_code == 200
    data = sse_data(resp.text)
    assert [json.loads(d)["choices"][0]["delta"].get("content") for d in data[:2]] == ["", "2"]
    assert json.loads(data[2]) == {
        "error": {
            "message": "anthropic error (529): Overloaded",
            "type": "upstream_error",
            "param": None,
            "code": "overloaded_error",
        }
    }
    assert data[3:] == ["[DONE]"]


def test_error_as_the_first_stream_event_is_the_streams_status(api: httpx.Client, upstream: Upstream) -> None:
    """An OpenAI-compatible server that answers 200 and then only an error event (OpenAI's envelope): the
    client gets the error's status, as before any byte was sent."""
    upstream.handler = reply_sse(
        [b'data: {"error":{"message":"The server had an error","type":"server_error","param":null,"code":null}}']
    )
    resp = api.post("/v1/chat/completions", json={"model": MODEL["vllm"], "messages": MESSAGES, "stream": True})
    assert resp.status_code == 502
    assert resp.json()["error"]["message"] == "upstream error (500): The server had an error"
