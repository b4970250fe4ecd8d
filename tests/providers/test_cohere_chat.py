"""Chat on Cohere's v2 `/chat` (providers/cohere_chat.py): the conversation as v2 messages, tools and
`tool_choice`, and the recorded answers and streams (text, tool calls with their argument pieces) as chat
shapes."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from gateway.path.chat_request import normalize_chat
from gateway.upstream.framing import DECODERS
from providers.base import CallContext, Endpoint, map_params
from providers.cohere import CohereAdapter
from tests.helpers.recordings import fixture_bytes, fixture_json
from wire.chat import ChatChunk, ChatRequest, decode_chat
from wire.errors import InvalidRequestError, UnsupportedParamError, UpstreamStatusError

ENDPOINT = Endpoint(provider="co", model="command-r7b-12-2024", base_url="https://api.cohere.com")
WEATHER = {
    "name": "get_weather",
    "description": "Run the get_weather tool.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
TOOLS = [
    {"type": "function", "function": {**WEATHER, "strict": True}},
    {"type": "function", "function": {"name": "get_time"}},
]


def _ctx() -> CallContext:
    return CallContext(id="chatcmpl-c1", created=1, model="co/x", chat=True)


def _req(**body: Any) -> ChatRequest:
    req = decode_chat(msgspec.json.encode({"model": "co/x", **body}))
    normalize_chat(req)
    return req


def _sent(req: ChatRequest) -> dict[str, Any]:
    adapter = CohereAdapter()
    assert adapter.chat_params is not None
    params, _ = map_params(req, adapter.chat_params, "co", False)
    up = adapter.build_chat_request(req, ENDPOINT, params)
    assert up.url == "https://api.cohere.com/v2/chat"
    body: dict[str, Any] = json.loads(up.body)
    return body


def _stream(name: str) -> list[ChatChunk]:
    decoder = DECODERS["sse"](max_event_bytes=1 << 20)
    adapter, ctx = CohereAdapter(), _ctx()
    chunks = []
    for event, data in [*decoder.feed(fixture_bytes(name)), *decoder.close()]:
        chunk = adapter.parse_chat_event(event, data, ctx)
        if chunk is not None:
            chunks.append(chunk)
    return chunks


def test_the_conversation_as_v2_messages() -> None:
    call = {
        "id": "get_weather_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
    }
    body = _sent(
        _req(
            messages=[
                {"role": "system", "content": "Be brief."},
                {"role": "developer", "content": "Use tools."},
                {"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
                {"role": "assistant", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "get_weather_1", "content": [{"type": "text", "text": "sunny"}]},
            ],
            tools=TOOLS,
            tool_choice="required",
            max_tokens=50,
            stop="END",
            top_p=0.5,
            top_k=-1,
            seed=3,
            response_format={"type": "json_object"},
        )
    )
    assert body["model"] == "command-r7b-12-2024"
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
        {"role": "assistant", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "get_weather_1", "content": "sunny"},
    ]
    # OpenAI's `strict` is not a field of Cohere's function.
    assert body["tools"] == [
        {"type": "function", "function": WEATHER},
        {"type": "function", "function": {"name": "get_time"}},
    ]
    assert body["tool_choice"] == "REQUIRED"
    assert (body["max_tokens"], body["stop_sequences"], body["p"], body["k"], body["seed"]) == (50, ["END"], 0.5, 0, 3)
    assert body["response_format"] == {"type": "json_object"}
    assert "stream" not in body


def test_tool_choice_and_response_format() -> None:
    user = [{"role": "user", "content": "hi"}]
    named = _sent(_req(messages=user, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_time"}}))
    assert named["tools"] == [{"type": "function", "function": {"name": "get_time"}}]
    assert named["tool_choice"] == "REQUIRED"
    assert "tool_choice" not in _sent(_req(messages=user, tools=TOOLS, tool_choice="auto"))
    assert _sent(_req(messages=user, tools=TOOLS, tool_choice="none"))["tool_choice"] == "NONE"
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "A", "schema": schema}}
    assert _sent(_req(messages=user, response_format=fmt))["response_format"] == {
        "type": "json_object",
        "json_schema": schema,
    }
    with pytest.raises(InvalidRequestError) as missing:
        _sent(_req(messages=user, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "other"}}))
    assert missing.value.param == "tool_choice"


def test_what_cohere_cannot_take_is_refused() -> None:
    user = [{"role": "user", "content": "hi"}]
    for field, value in (("logprobs", True), ("parallel_tool_calls", False), ("logit_bias", {"1": 1})):
        extra = {"tools": TOOLS} if field == "parallel_tool_calls" else {}
        with pytest.raises(UnsupportedParamError) as caught:
            _sent(_req(messages=user, **{field: value}, **extra))
        assert caught.value.param == field
    with pytest.raises(InvalidRequestError) as range_error:
        _sent(_req(messages=user, top_p=1.0))
    assert range_error.value.param == "top_p"


def test_recorded_tool_call_answer() -> None:
    recorded = fixture_json("cohere/v2_chat_tool_call.json")
    answer = CohereAdapter().parse_chat_response(fixture_bytes("cohere/v2_chat_tool_call.json"), _ctx())
    (choice,) = answer.choices
    (call,) = choice.message.tool_calls or []
    sent = recorded["message"]["tool_calls"][0]
    assert (call.id, call.function.name, call.function.arguments) == (
        sent["id"],
        sent["function"]["name"],
        sent["function"]["arguments"],
    )
    # The tool plan is Cohere's reasoning, not the answer's content.
    assert choice.message.content is None and choice.finish_reason == "tool_calls"
    usage = answer.usage
    assert usage is not None and (usage.prompt_tokens, usage.completion_tokens) == (35, 22)
    assert usage.prompt_tokens_details is not None and usage.prompt_tokens_details.cached_tokens == 1024


def test_a_tool_call_without_an_id_gets_one() -> None:
    # Cohere's v2 answers always carry one; were it left out or empty (the recording with it taken out), the
    # client would get a call it could not answer: the gateway makes one, buffered as streamed.
    recorded = fixture_json("cohere/v2_chat_tool_call.json")
    del recorded["message"]["tool_calls"][0]["id"]
    answer = CohereAdapter().parse_chat_response(json.dumps(recorded).encode(), _ctx())
    assert [c.id for c in answer.choices[0].message.tool_calls or []] == ["call_c1_0_0"]
    raw = fixture_bytes("cohere/v2_chat_stream_tool_calls.sse.txt").decode()
    starts = [line[len("data: ") :] for line in raw.splitlines() if '"tool-call-start"' in line]
    start = json.loads(starts[0])
    start["delta"]["message"]["tool_calls"]["id"] = ""
    chunk = CohereAdapter().parse_chat_event(None, json.dumps(start).encode(), _ctx())
    assert chunk is not None and [c.id for c in chunk.choices[0].delta.tool_calls or []] == ["call_c1_0_0"]


def test_recorded_text_answer() -> None:
    answer = CohereAdapter().parse_chat_response(fixture_bytes("cohere/v2_chat_stop_sequence.json"), _ctx())
    (choice,) = answer.choices
    assert choice.message.content == "The capital of France is a city known as"
    assert choice.finish_reason == "stop" and choice.message.tool_calls is None


def test_recorded_thinking_is_reasoning_content() -> None:
    thinking, text = fixture_json("cohere/v2_chat_thinking.json")["message"]["content"]
    answer = CohereAdapter().parse_chat_response(fixture_bytes("cohere/v2_chat_thinking.json"), _ctx())
    (choice,) = answer.choices
    assert thinking["type"] == "thinking" and choice.message.reasoning_content == thinking["thinking"]
    assert choice.message.content == text["text"] and choice.finish_reason == "stop"
    # Streamed, as Cohere's v2 chat reference gives a reasoning model's content-delta: thinking, then text.
    ctx, adapter = _ctx(), CohereAdapter()
    think = b'{"type":"content-delta","index":0,"delta":{"message":{"content":{"thinking":"Let me see."}}}}'
    say = b'{"type":"content-delta","index":1,"delta":{"message":{"content":{"text":"Walk."}}}}'
    first, second = adapter.parse_chat_event(None, think, ctx), adapter.parse_chat_event(None, say, ctx)
    assert first is not None and first.choices[0].delta.reasoning_content == "Let me see."
    assert first.choices[0].delta.content is None
    assert second is not None and second.choices[0].delta.content == "Walk."


def test_tool_call_stream_arguments_byte_for_byte() -> None:
    raw = fixture_bytes("cohere/v2_chat_stream_tool_calls.sse.txt").decode()
    events = [json.loads(line[len("data: ") :]) for line in raw.splitlines() if line.startswith("data: ")]
    want: dict[int, list[str]] = {}
    for e in events:
        calls = e.get("delta", {}).get("message", {}).get("tool_calls")
        if e["type"] == "tool-call-start":
            want[e["index"]] = [calls["id"], calls["function"]["name"], calls["function"]["arguments"]]
        elif e["type"] == "tool-call-delta":
            want[e["index"]][2] += calls["function"]["arguments"]

    chunks = _stream("cohere/v2_chat_stream_tool_calls.sse.txt")
    assert chunks[0].choices[0].delta.role == "assistant"
    got: dict[int, list[str]] = {}
    for c in chunks:
        for tc in c.choices[0].delta.tool_calls or ():
            slot = got.setdefault(tc.index, ["", "", ""])
            slot[0] += tc.id or ""
            slot[1] += (tc.function.name if tc.function else None) or ""
            slot[2] += (tc.function.arguments if tc.function else None) or ""
    assert got == want
    assert json.loads(got[0][2]) == {"location": "Madrid"}
    last = chunks[-1]
    assert last.choices[0].finish_reason == "tool_calls"
    assert last.usage is not None and (last.usage.prompt_tokens, last.usage.completion_tokens) == (37, 28)
    # The tool plan is not content.
    assert all(not c.choices[0].delta.content for c in chunks)


def test_text_stream() -> None:
    chunks = _stream("cohere/v2_chat_stream_text.sse.txt")
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "Coca-Cola"
    assert chunks[-1].choices[0].finish_reason == "length"


def test_failed_generation_is_an_error() -> None:
    end = b'{"type":"message-end","delta":{"finish_reason":"ERROR","error":"internal"}}'
    with pytest.raises(UpstreamStatusError) as caught:
        CohereAdapter().parse_chat_event("message-end", end, _ctx())
    assert caught.value.upstream_status == 500
    timeout = b'{"finish_reason":"TIMEOUT","message":{"content":[]}}'
    with pytest.raises(UpstreamStatusError) as late:
        CohereAdapter().parse_chat_response(timeout, _ctx())
    assert late.value.upstream_status == 504
