"""Tool calls on the chat route, through the SDK: OpenAI's recorded call, its streamed parallel calls
reassembled byte for byte, calls an upstream sent without ids, and Anthropic's tool_use blocks as calls."""

from __future__ import annotations

import json
from typing import Any

import openai
from openai.types.chat import ChatCompletionMessageFunctionToolCall

from tests.clients.chat.upstreams import MESSAGES, TOOLS, data, sse
from tests.helpers.recordings import fixture_json
from tests.helpers.upstreams import Received


def test_tools(client: openai.OpenAI, received: list[Received]) -> None:
    recorded = fixture_json("openai/chat_tool_calls.json")["choices"][0]["message"]["tool_calls"][0]
    answer = client.chat.completions.create(
        model="oa/gpt-3.5-turbo", messages=MESSAGES, tools=TOOLS, tool_choice="auto", parallel_tool_calls=True
    )
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls or []
    assert call.type == "function" and call.id == recorded["id"]
    assert call.function.name == recorded["function"]["name"]
    assert call.function.arguments == recorded["function"]["arguments"]
    body = received[0].json()
    assert body["tools"] == TOOLS and body["tool_choice"] == "auto" and body["parallel_tool_calls"] is True


def test_stream_tool_call_deltas(client: openai.OpenAI, received: list[Received]) -> None:
    """The SDK reassembles the provider's arguments byte for byte from the relayed deltas."""
    recorded = data(sse("openai/chat_stream_tool_calls_parallel.sse.txt"))
    want: dict[int, dict[str, str]] = {}
    for event in recorded:
        for ch in event["choices"]:
            for tc in ch["delta"].get("tool_calls") or ():
                slot = want.setdefault(tc["index"], {"id": "", "name": "", "arguments": ""})
                slot["id"] += tc.get("id") or ""
                slot["name"] += (tc.get("function") or {}).get("name") or ""
                slot["arguments"] += (tc.get("function") or {}).get("arguments") or ""
    assert len(want) == 2  # the recording holds two parallel calls

    got: dict[int, dict[str, str]] = {}
    chunks = list(client.chat.completions.create(model="oa/gpt-3.5-turbo", messages=MESSAGES, tools=TOOLS, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    for chunk in chunks:
        assert chunk.object == "chat.completion.chunk" and chunk.model == "oa/gpt-3.5-turbo"
        for sc in chunk.choices:
            for call in sc.delta.tool_calls or ():
                slot = got.setdefault(call.index, {"id": "", "name": "", "arguments": ""})
                slot["id"] += call.id or ""
                slot["name"] += (call.function.name if call.function else None) or ""
                slot["arguments"] += (call.function.arguments if call.function else None) or ""
    assert got == want
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    # The gateway asked for the usage chunk (it settles limits on it) though the client did not.
    assert received[0].json()["stream_options"] == {"include_usage": True}


def test_tool_calls_an_upstream_sent_without_ids_get_ids_the_conversation_can_send_back(
    client: openai.OpenAI, received: list[Received]
) -> None:
    answer = client.chat.completions.create(model="hosted/noids", messages=MESSAGES, tools=TOOLS)
    (call,) = answer.choices[0].message.tool_calls or []
    assert call.id and call.id.startswith("call_"), call
    # Streamed, each call's first piece carries one (the server sent null for one, "" for the other); the pieces
    # after it none, so the SDK's reassembly keeps it whole.
    ids: dict[int, str] = {}
    pieces: dict[int, int] = {}
    for chunk in client.chat.completions.create(model="hosted/noids", messages=MESSAGES, tools=TOOLS, stream=True):
        for sc in chunk.choices:
            for c in sc.delta.tool_calls or ():
                if c.id is not None:
                    pieces[c.index] = pieces.get(c.index, 0) + 1
                    ids[c.index] = c.id
    assert sorted(ids) == [0, 1] and pieces == {0: 1, 1: 1} and len({*ids.values(), call.id}) == 3, ids
    assert all(i.startswith("call_") for i in ids.values())
    # The conversation with the answer's call and its result goes back as it came: no 400.
    turn: Any = answer.choices[0].message.model_dump(exclude_none=True)
    result: Any = {"role": "tool", "tool_call_id": call.id, "content": "57F"}
    again = client.chat.completions.create(model="hosted/noids", messages=[*MESSAGES, turn, result], tools=TOOLS)
    assert again.choices[0].finish_reason == "tool_calls"
    assert received[-1].json()["messages"][-2]["tool_calls"][0]["id"] == call.id


def test_anthropic_tool_calls_through_the_sdk(client: openai.OpenAI, received: list[Received]) -> None:
    """Anthropic's Messages API behind the chat route: its tool_use blocks are the SDK's tool calls, and its
    streamed `input_json_delta` pieces reassemble into each call's arguments."""
    recorded = fixture_json("anthropic/messages_tool_use.json")
    answer = client.chat.completions.create(
        model="claude/claude-3-5-sonnet-20240620",
        messages=[{"role": "system", "content": "Be brief."}, *MESSAGES],
        tools=TOOLS,
        max_tokens=300,
    )
    calls = [
        c for c in answer.choices[0].message.tool_calls or () if isinstance(c, ChatCompletionMessageFunctionToolCall)
    ]
    uses = [b for b in recorded["content"] if b["type"] == "tool_use"]
    assert [(c.id, c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        (b["id"], b["name"], b["input"]) for b in uses
    ]
    assert answer.choices[0].finish_reason == "tool_calls"
    sent = received[0]
    assert sent.path == "/v1/messages" and sent.headers["x-api-key"] == "sk-ant"
    assert sent.json()["system"] == "Be brief." and sent.json()["max_tokens"] == 300

    chunks = list(
        client.chat.completions.create(
            model="claude/claude-3-5-sonnet-20240620",
            messages=MESSAGES,
            tools=TOOLS,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    args: dict[int, str] = {}
    for chunk in chunks:
        for sc in chunk.choices:
            for call in sc.delta.tool_calls or ():
                args[call.index] = args.get(call.index, "") + (
                    (call.function.arguments if call.function else None) or ""
                )
    assert [sorted(json.loads(a)) for _, a in sorted(args.items())] == [["location", "unit"], ["timezone"]]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 153
