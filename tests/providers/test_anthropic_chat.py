"""Chat on Anthropic's Messages API (providers/anthropic_chat.py): the conversation as Anthropic's turns, and
the recorded answers and streams (text, two tool calls, `input_json_delta` pieces) as chat shapes."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from gateway.path.chat_request import normalize_chat
from gateway.upstream.framing import DECODERS
from providers.anthropic import AnthropicAdapter
from providers.base import CallContext, Endpoint, map_params
from tests.helpers.recordings import fixture_bytes, fixture_json
from wire.chat import ChatChunk, ChatRequest, decode_chat
from wire.errors import InvalidRequestError, UnsupportedParamError

ENDPOINT = Endpoint(provider="claude", model="claude-3-5-sonnet-20240620", base_url="https://api.anthropic.com")
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


def _ctx() -> CallContext:
    return CallContext(id="chatcmpl-a", created=1, model="claude/x", chat=True)


def _req(**body: Any) -> ChatRequest:
    req = decode_chat(msgspec.json.encode({"model": "claude/x", **body}))
    normalize_chat(req)
    return req


def _sent(req: ChatRequest) -> dict[str, Any]:
    adapter = AnthropicAdapter()
    assert adapter.chat_params is not None
    params, _ = map_params(req, adapter.chat_params, "claude", False)
    out: dict[str, Any] = json.loads(adapter.build_chat_request(req, ENDPOINT, params).body)
    return out


def test_the_conversation_as_anthropic_turns() -> None:
    call = {"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"SF"}'}}
    body = _sent(
        _req(
            messages=[
                {"role": "system", "content": "Be brief."},
                {"role": "developer", "content": "Use tools."},
                {"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
                {"role": "assistant", "content": "Checking.", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"},
                {"role": "user", "content": "Thanks"},
            ],
            tools=TOOLS,
            tool_choice="required",
            parallel_tool_calls=False,
            stop="END",
            max_tokens=50,
        )
    )
    assert body["system"] == "Be brief.\n\nUse tools."
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "SF"}},
            ],
        },
        # The tool's result and the next user turn: one user turn, as the API wants turns to alternate.
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                {"type": "text", "text": "Thanks"},
            ],
        },
    ]
    assert body["tools"] == [{"name": "get_weather", "input_schema": {"type": "object"}}]
    assert body["tool_choice"] == {"type": "any", "disable_parallel_tool_use": True}
    assert body["stop_sequences"] == ["END"] and body["max_tokens"] == 50


def test_what_anthropic_cannot_honour_is_refused() -> None:
    user = [{"role": "user", "content": "hi"}]
    with pytest.raises(UnsupportedParamError) as caught:
        _sent(_req(messages=user, response_format={"type": "json_object"}))
    assert caught.value.param == "response_format"
    with pytest.raises(InvalidRequestError) as range_error:
        _sent(_req(messages=user, temperature=1.5))
    assert range_error.value.param == "temperature"
    for arguments in ("[1]", '{"a":' * 5000 + "1" + "}" * 5000):  # the second past the recursion limit
        bad = {"id": "t", "type": "function", "function": {"name": "f", "arguments": arguments}}
        with pytest.raises(InvalidRequestError) as not_an_object:
            _sent(_req(messages=[*user, {"role": "assistant", "tool_calls": [bad]}]))
        assert not_an_object.value.param == "messages"


def test_recorded_tool_use_answer() -> None:
    recorded = fixture_json("anthropic/messages_tool_use.json")
    answer = AnthropicAdapter().parse_chat_response(fixture_bytes("anthropic/messages_tool_use.json"), _ctx())
    (choice,) = answer.choices
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == recorded["content"][0]["text"]
    uses = [b for b in recorded["content"] if b["type"] == "tool_use"]
    calls = choice.message.tool_calls or []
    assert [(c.id, c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        (b["id"], b["name"], b["input"]) for b in uses
    ]
    assert answer.usage is not None and answer.usage.completion_tokens == recorded["usage"]["output_tokens"]


def test_recorded_tool_use_stream() -> None:
    raw = fixture_bytes("anthropic/messages_stream_tool_use.sse.txt")
    decoder = DECODERS["sse"](max_event_bytes=1 << 20)
    adapter, ctx = AnthropicAdapter(), _ctx()
    chunks: list[ChatChunk] = []
    for event, data in [*decoder.feed(raw), *decoder.close()]:
        chunk = adapter.parse_chat_event(event, data, ctx)
        if chunk is not None:
            chunks.append(chunk)
    # What the recording sent, per content block: the text, and each tool block's id, name and JSON pieces.
    events = [json.loads(line[len("data: ") :]) for line in raw.decode().splitlines() if line.startswith("data: ")]
    text = "".join(e["delta"].get("text", "") for e in events if e["type"] == "content_block_delta")
    starts = [e["content_block"] for e in events if e["type"] == "content_block_start"]
    tools = [b for b in starts if b["type"] == "tool_use"]
    pieces = {
        e["index"]: "".join(
            x["delta"].get("partial_json", "") for x in events if x.get("index") == e["index"] and "delta" in x
        )
        for e in events
        if e["type"] == "content_block_start" and e["content_block"]["type"] == "tool_use"
    }

    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == text
    got: dict[int, list[str]] = {}
    for c in chunks:
        for tc in c.choices[0].delta.tool_calls or ():
            slot = got.setdefault(tc.index, ["", "", ""])
            slot[0] += tc.id or ""
            slot[1] += (tc.function.name if tc.function else None) or ""
            slot[2] += (tc.function.arguments if tc.function else None) or ""
    assert got == {
        i: [b["id"], b["name"], args] for i, (b, args) in enumerate(zip(tools, pieces.values(), strict=True))
    }
    assert all(json.loads(args) for _, _, args in got.values())
    last = chunks[-1]
    assert last.choices[0].finish_reason == "tool_calls"
    assert last.usage is not None and last.usage.completion_tokens == 153


def test_recorded_thinking_is_reasoning_content() -> None:
    # Extended thinking (`thinking: {type: enabled}`, sent through `inference_extra_params`): the thinking
    # block's text is `reasoning_content` and, with its signature, the one of `thinking_blocks`; the text
    # block is the content.
    recorded = fixture_json("anthropic/messages_thinking.json")
    thinking, text = recorded["content"]
    answer = AnthropicAdapter().parse_chat_response(fixture_bytes("anthropic/messages_thinking.json"), _ctx())
    (choice,) = answer.choices
    assert thinking["type"] == "thinking" and choice.message.reasoning_content == thinking["thinking"]
    assert choice.message.content == text["text"]
    assert msgspec.to_builtins(choice.message.thinking_blocks) == [thinking]
    raw = fixture_bytes("anthropic/messages_stream_thinking.sse.txt")
    decoder = DECODERS["sse"](max_event_bytes=1 << 20)
    adapter, ctx = AnthropicAdapter(), _ctx()
    chunks = [
        c for e, d in [*decoder.feed(raw), *decoder.close()] if (c := adapter.parse_chat_event(e, d, ctx)) is not None
    ]
    events = [json.loads(line[len("data: ") :]) for line in raw.decode().splitlines() if line.startswith("data: ")]
    deltas = [e["delta"] for e in events if e["type"] == "content_block_delta"]
    reasoning = "".join(c.choices[0].delta.reasoning_content or "" for c in chunks)
    assert reasoning == "".join(d.get("thinking", "") for d in deltas if d["type"] == "thinking_delta")
    assert reasoning.startswith("This is a straightforward question")
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "".join(
        d.get("text", "") for d in deltas if d["type"] == "text_delta"
    )
    first_text = next(i for i, c in enumerate(chunks) if c.choices[0].delta.content)
    assert all(not c.choices[0].delta.reasoning_content for c in chunks[first_text:])
    assert chunks[-1].choices[0].finish_reason == "stop"
    # The block whole, once, in a chunk of its own when it ends: before the text, after its last piece.
    signed = [(i, c.choices[0].delta) for i, c in enumerate(chunks) if c.choices[0].delta.thinking_blocks]
    ((at, delta),) = signed
    signature = "".join(d.get("signature", "") for d in deltas if d["type"] == "signature_delta")
    assert msgspec.to_builtins(delta.thinking_blocks) == [
        {"type": "thinking", "thinking": reasoning, "signature": signature}
    ]
    assert delta.content is None and delta.reasoning_content is None and signature.startswith("EvMCCkYICxgC")
    last_piece = max(i for i, c in enumerate(chunks) if c.choices[0].delta.reasoning_content)
    assert last_piece < at < first_text
    # The completion route has no place for thinking: its text is the answer's alone.
    completion = AnthropicAdapter().parse_response(fixture_bytes("anthropic/messages_thinking.json"), _ctx())
    assert completion.choices[0].text == text["text"]


def test_thinking_blocks_sent_back_lead_their_turn() -> None:
    # A client that appends the answer's message sends its blocks back: Anthropic wants them first in the turn
    # (before the tool_use they led to), as they came; a block without a signature it would refuse: left out.
    recorded = fixture_json("anthropic/messages_thinking.json")["content"][0]
    call = {"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
    turn = {
        "role": "assistant",
        "content": None,
        "tool_calls": [call],
        "reasoning_content": recorded["thinking"],
        "thinking_blocks": [
            recorded,
            {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT"},
            {"type": "thinking", "thinking": "unsigned"},
        ],
    }
    body = _sent(
        _req(
            messages=[
                {"role": "user", "content": "Weather?"},
                turn,
                {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"},
            ],
            tools=TOOLS,
        )
    )
    assert body["messages"][1] == {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": recorded["thinking"], "signature": recorded["signature"]},
            {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT"},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}},
        ],
    }


def test_a_redacted_block_streams_whole_and_an_unsigned_one_is_not_listed() -> None:
    adapter, ctx = AnthropicAdapter(), _ctx()

    def event(body: dict[str, Any]) -> ChatChunk | None:
        return adapter.parse_chat_event(body["type"], msgspec.json.encode(body), ctx)

    redacted = {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix"}
    chunk = event({"type": "content_block_start", "index": 0, "content_block": redacted})
    assert chunk is not None and msgspec.to_builtins(chunk.choices[0].delta.thinking_blocks) == [redacted]
    assert event({"type": "content_block_stop", "index": 0}) is None
    start = {"type": "thinking", "thinking": "", "signature": ""}
    assert event({"type": "content_block_start", "index": 1, "content_block": start}) is None
    piece = event({"type": "content_block_delta", "index": 1, "delta": {"type": "thinking_delta", "thinking": "x"}})
    assert piece is not None and piece.choices[0].delta.reasoning_content == "x"
    assert event({"type": "content_block_stop", "index": 1}) is None  # never signed: no block to list
    # A buffered answer lists its redacted block too, in its place among the signed ones.
    body = {"content": [redacted, {"type": "text", "text": "hi"}], "stop_reason": "end_turn"}
    answer = adapter.parse_chat_response(msgspec.json.encode(body), _ctx())
    assert msgspec.to_builtins(answer.choices[0].message.thinking_blocks) == [redacted]
