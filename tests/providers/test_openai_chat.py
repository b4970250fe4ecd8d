"""OpenAI's chat wire (providers/openai_chat.py) against recorded chat answers and streams of several
vendors, and the chat request each kind is sent (its route, its names for the fields)."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from gateway.cache.chat import Assembly
from gateway.path.chat_request import normalize_chat
from gateway.upstream.framing import DECODERS
from providers import REGISTRY
from providers.base import CallContext, Endpoint, map_params
from providers.openai_chat import OpenAIChat
from tests.helpers.recordings import fixture_bytes, fixture_json
from wire.chat import ChatChunk, answer_chunks, decode_chat
from wire.errors import InvalidRequestError, UnsupportedParamError

CHAT_KINDS = {"openai", "azure", "fireworks", "together", "vllm", "sglang", "deepseek", "pais", "mistral", "tgi"}
CHAT_KINDS |= {"ollama", "llamacpp", "sgp"}


def _adapter(kind: str) -> OpenAIChat:
    adapter = REGISTRY[kind]()
    assert isinstance(adapter, OpenAIChat)
    return adapter


def _ctx() -> CallContext:
    return CallContext(id="chatcmpl-test", created=1, model="client/model", chat=True)


@pytest.mark.parametrize(
    ("kind", "name"),
    [
        ("openai", "openai/chat_tool_calls.json"),
        ("openai", "openai/chat_o3mini_stop_sequence.json"),
        ("openai", "openai/chat_completion.json"),
        ("azure", "azure/chat_finish_reason_content_filter.json"),
        ("mistral", "mistral/chat_with_ratelimit_headers.json"),
    ],
)
def test_recorded_answers(kind: str, name: str) -> None:
    recorded = fixture_json(name)
    answer = _adapter(kind).parse_chat_response(fixture_bytes(name), _ctx())
    assert answer.id == "chatcmpl-test" and answer.model == "client/model"
    assert answer.created == recorded["created"]
    (want,), (got,) = recorded["choices"], answer.choices
    message = want.get("message") or {}
    assert got.message.role == "assistant"
    assert got.message.content == message.get("content")
    assert [(c.id, c.function.name, c.function.arguments) for c in got.message.tool_calls or ()] == [
        (c["id"], c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls") or ()
    ]
    assert got.finish_reason == want["finish_reason"]
    assert answer.usage is not None
    assert answer.usage.prompt_tokens == recorded["usage"]["prompt_tokens"]
    assert answer.usage.total_tokens == recorded["usage"]["total_tokens"]
    details = recorded["usage"].get("completion_tokens_details")
    if details:
        assert answer.usage.completion_tokens_details is not None
        assert answer.usage.completion_tokens_details.reasoning_tokens == details["reasoning_tokens"]


def _stream(kind: str, name: str) -> list[ChatChunk]:
    decoder = DECODERS["sse"](max_event_bytes=1 << 20)
    adapter, ctx = _adapter(kind), _ctx()
    chunks = []
    for event, data in [*decoder.feed(fixture_bytes(name)), *decoder.close()]:
        chunk = adapter.parse_chat_event(event, data, ctx)
        if chunk is not None:
            chunks.append(chunk)
    return chunks


def test_recorded_fireworks_stream() -> None:
    name = "fireworks/chat_stream_via_hf_router.sse.txt"
    events = [json.loads(line[6:]) for line in fixture_bytes(name).decode().splitlines() if line[6:].startswith("{")]
    chunks = _stream("fireworks", name)
    assert len(chunks) == len(events)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(ch.delta.content or "" for c in chunks for ch in c.choices)
    assert text == "".join(ch["delta"].get("content") or "" for e in events for ch in e["choices"])
    assert [c.choices[0].finish_reason for c in chunks][-1] == "length"
    last = events[-1]["usage"]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == last["completion_tokens"]


def test_recorded_parallel_tool_call_stream() -> None:
    name = "openai/chat_stream_tool_calls_parallel.sse.txt"
    args: dict[int, str] = {}
    names: dict[int, str] = {}
    for chunk in _stream("openai", name):
        for ch in chunk.choices:
            for tc in ch.delta.tool_calls or ():
                assert tc.function is not None
                args[tc.index] = args.get(tc.index, "") + (tc.function.arguments or "")
                if tc.function.name:
                    names[tc.index] = tc.function.name
    assert names == {0: "get_current_weather", 1: "get_current_weather"}
    assert [json.loads(a)["location"] for _, a in sorted(args.items())] == ["San Francisco", "Boston"]


def _request(body: dict[str, Any]) -> Any:
    req = decode_chat(msgspec.json.encode({"model": "p/m", "messages": [{"role": "user", "content": "hi"}], **body}))
    return normalize_chat(req)


@pytest.mark.parametrize(
    ("kind", "base", "url"),
    [
        ("openai", "https://api.openai.com/v1", "https://api.openai.com/v1/chat/completions"),
        (
            "fireworks",
            "https://api.fireworks.ai/inference/v1",
            "https://api.fireworks.ai/inference/v1/chat/completions",
        ),
        ("vllm", "http://vllm:8000/v1", "http://vllm:8000/v1/chat/completions"),
        ("tgi", "http://tgi:80", "http://tgi:80/v1/chat/completions"),
        ("ollama", "http://127.0.0.1:11434", "http://127.0.0.1:11434/v1/chat/completions"),
        ("llamacpp", "http://llama:8080", "http://llama:8080/v1/chat/completions"),
        ("mistral", "https://api.mistral.ai", "https://api.mistral.ai/v1/chat/completions"),
        ("sgp", "https://api.egp.scale.com", "https://api.egp.scale.com/v4/beta/chat/completions"),
        (
            "azure",
            "https://res.openai.azure.com",
            "https://res.openai.azure.com/openai/deployments/m/chat/completions?api-version=2024-10-21",
        ),
    ],
)
def test_the_route_and_the_body_each_kind_is_sent(kind: str, base: str, url: str) -> None:
    adapter = _adapter(kind)
    req = _request({"max_tokens": 7, "temperature": 0.5, "stream": True, "seed": 4})
    assert adapter.chat_params is not None
    params, _ = map_params(req, adapter.chat_params, "p", True)
    sent = adapter.build_chat_request(req, Endpoint(provider="p", model="m", base_url=base), params)
    assert sent.url == url
    body = json.loads(sent.body)
    assert body["messages"] == [{"role": "user", "content": "hi"}] and body["model"] == "m"
    limit = "max_completion_tokens" if kind in ("openai", "azure") else "max_tokens"
    assert body[limit] == 7 and body["temperature"] == 0.5 and body["stream"] is True
    assert body.get("random_seed" if kind == "mistral" else "seed") == 4


def test_azure_takes_openais_service_fields_but_not_its_web_search() -> None:
    fields = {
        "store": True,
        "metadata": {"team": "a"},
        "service_tier": "priority",
        "prompt_cache_key": "conv-1",
        "safety_identifier": "u-1",
    }
    adapter = _adapter("azure")
    req = _request(fields)
    params, _ = map_params(req, adapter.chat_params or {}, "az", False)
    sent = adapter.build_chat_request(req, Endpoint(provider="az", model="m", base_url="https://r"), params)
    assert {k: json.loads(sent.body)[k] for k in fields} == fields
    with pytest.raises(UnsupportedParamError) as refused:
        map_params(_request({"web_search_options": {}}), adapter.chat_params or {}, "az", False)
    assert refused.value.param == "web_search_options"


def test_fireworks_takes_its_priority_tier_and_the_cache_key() -> None:
    adapter = _adapter("fireworks")
    fields = {"service_tier": "priority", "prompt_cache_key": "conv-1"}
    req = _request(fields)
    params, _ = map_params(req, adapter.chat_params or {}, "fw", False)
    sent = adapter.build_chat_request(req, Endpoint(provider="fw", model="m", base_url="https://f/v1"), params)
    assert {k: json.loads(sent.body)[k] for k in fields} == fields
    # Its completions route documents neither.
    for name, value in fields.items():
        with pytest.raises(UnsupportedParamError) as refused:
            map_params(_request({name: value}), adapter.params, "fw", False)
        assert refused.value.param == name


def test_logprobs_become_the_chat_pair() -> None:
    req = _request({"logprobs": True, "top_logprobs": 3})
    params, _ = map_params(req, _adapter("vllm").chat_params or {}, "p", False)
    assert params == {"logprobs": True, "top_logprobs": 3}


def test_extra_params_may_not_replace_the_conversation() -> None:
    req = _request({"inference_extra_params": {"messages": []}})
    with pytest.raises(InvalidRequestError) as caught:
        _adapter("vllm").build_chat_request(req, Endpoint(provider="p", model="m", base_url="http://v/v1"), {})
    assert caught.value.param == "inference_extra_params.messages"


def test_which_kinds_serve_chat() -> None:
    native = {"anthropic", "bedrock", "gemini", "cohere", "fake"}
    assert {k for k, cls in REGISTRY.items() if cls.chat_params is not None} == CHAT_KINDS | native


@pytest.mark.parametrize("name", ["reasoning_content", "reasoning"])
def test_a_reasoning_models_thinking_is_kept_apart_from_its_answer(name: str) -> None:
    """vLLM (with a reasoning parser) and DeepSeek send the thinking as `reasoning_content`; newer vLLM also as
    `reasoning`. Both reach the client as `reasoning_content`, buffered, streamed, and through a stored answer."""
    adapter = _adapter("vllm")
    answer = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 7,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Paris.", name: "The capital of France is Paris."},
                "finish_reason": "stop",
            }
        ],
    }
    got = adapter.parse_chat_response(json.dumps(answer).encode(), _ctx())
    message = got.choices[0].message
    assert (message.content, message.reasoning_content) == ("Paris.", "The capital of France is Paris.")
    encoded = json.loads(msgspec.json.encode(got))
    assert encoded["choices"][0]["message"]["reasoning_content"] == "The capital of France is Paris."
    # Streamed: a chunk that carries only thinking is relayed with it, not as an empty delta.
    chunk = {**answer, "object": "chat.completion.chunk"}
    chunk["choices"] = [{"index": 0, "delta": {name: "The capital"}, "finish_reason": None}]
    streamed = adapter.parse_chat_event(None, json.dumps(chunk).encode(), _ctx())
    assert streamed is not None
    assert json.loads(msgspec.json.encode(streamed))["choices"][0]["delta"] == {"reasoning_content": "The capital"}
    # A stored answer replays its thinking first, and the chunks add up to the same answer.
    assembly = Assembly(1 << 20)
    for piece in answer_chunks(got):
        assert assembly.add(piece)
    again = assembly.answer(None, 1)
    assert again is not None and again.choices[0].message == message
