"""Chat on Bedrock's Converse, reasoning: the recorded reasoning beside a tool call and the recorded reasoning
stream as `reasoning_content` (tests/fixtures/SOURCES.md), signed and redacted reasoning blocks as
`thinking_blocks`, and those blocks sent back at the head of their turn."""

from __future__ import annotations

import msgspec

from tests.helpers.recordings import fixture_bytes, fixture_json
from tests.providers.bedrock_setup import ADAPTER, TOOLS, USER, chat_body, chat_chunks, chat_ctx, frame_payloads


def test_recorded_reasoning_is_reasoning_content_not_content() -> None:
    recorded = fixture_json("bedrock/converse_reasoning_tool_use.json")["output"]["message"]["content"][0]
    answer = ADAPTER.parse_chat_response(fixture_bytes("bedrock/converse_reasoning_tool_use.json"), chat_ctx())
    (choice,) = answer.choices
    assert choice.message.content is None and choice.finish_reason == "tool_calls"
    assert choice.message.reasoning_content == recorded["reasoningContent"]["reasoningText"]["text"]
    calls = choice.message.tool_calls or []
    assert [(c.id, c.function.name, c.function.arguments) for c in calls] == [
        ("functions.get_temperature:0", "get_temperature", '{"city":"London"}')
    ]


def test_recorded_reasoning_stream() -> None:
    # Claude on Bedrock with thinking on: block 0's reasoningContent pieces (and its signature), then text.
    raw = fixture_bytes("bedrock/converse_stream_reasoning.eventstream")
    chunks = [c for c in chat_chunks(raw) if c.choices]
    deltas = [e["delta"] for e in frame_payloads(raw) if "delta" in e]
    reasoning = "".join(c.choices[0].delta.reasoning_content or "" for c in chunks)
    assert reasoning == "".join(d["reasoningContent"].get("text", "") for d in deltas if "reasoningContent" in d)
    assert reasoning.startswith("The user has greeted me")
    content = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert content == "".join(d.get("text", "") for d in deltas) and content.endswith("you today?")
    assert chunks[-1].choices[0].finish_reason == "stop"
    # The signed block whole, in a chunk of its own when block 0 stops, before the text.
    signature = "".join(d["reasoningContent"].get("signature", "") for d in deltas if "reasoningContent" in d)
    signed = [
        (i, c.choices[0].delta.thinking_blocks) for i, c in enumerate(chunks) if c.choices[0].delta.thinking_blocks
    ]
    assert [(b, msgspec.to_builtins(blocks)) for b, blocks in signed] == [
        (signed[0][0], [{"type": "thinking", "thinking": reasoning, "signature": signature}])
    ]
    assert signature.startswith("Eu0CCkgIBxAB")
    assert signed[0][0] < next(i for i, c in enumerate(chunks) if c.choices[0].delta.content)


def test_signed_and_redacted_reasoning_blocks_as_thinking_blocks() -> None:
    # Converse's ReasoningContentBlock (docs.aws.amazon.com/bedrock/latest/APIReference/
    # API_runtime_ReasoningContentBlock.html): `reasoningText` {text, signature} or `redactedContent` (a blob,
    # base64 in JSON). The recorded answer (no signature: not Claude) lists no block.
    unsigned = ADAPTER.parse_chat_response(fixture_bytes("bedrock/converse_reasoning_tool_use.json"), chat_ctx())
    assert unsigned.choices[0].message.thinking_blocks is None
    recorded = fixture_json("bedrock/converse_reasoning_tool_use.json")
    blocks = recorded["output"]["message"]["content"]
    blocks[0]["reasoningContent"]["reasoningText"]["signature"] = "Eu0CCkgIBxAB"
    blocks.insert(1, {"reasoningContent": {"redactedContent": "AQIDBA=="}})
    answer = ADAPTER.parse_chat_response(msgspec.json.encode(recorded), chat_ctx())
    text = blocks[0]["reasoningContent"]["reasoningText"]["text"]
    assert msgspec.to_builtins(answer.choices[0].message.thinking_blocks) == [
        {"type": "thinking", "thinking": text, "signature": "Eu0CCkgIBxAB"},
        {"type": "redacted_thinking", "data": "AQIDBA=="},
    ]
    assert answer.choices[0].message.reasoning_content == text


def test_thinking_blocks_sent_back_lead_their_turn() -> None:
    call = {"id": "tooluse_1", "type": "function", "function": {"name": "get_temperature", "arguments": "{}"}}
    turn = {
        "role": "assistant",
        "tool_calls": [call],
        "reasoning_content": "Let me look.",
        "thinking_blocks": [
            {"type": "thinking", "thinking": "Let me look.", "signature": "Eu0CCkgIBxAB"},
            {"type": "redacted_thinking", "data": "AQIDBA=="},
            {"type": "thinking", "thinking": "no signature: left out"},
        ],
    }
    body = chat_body(
        messages=[*USER, turn, {"role": "tool", "tool_call_id": "tooluse_1", "content": "30"}],
        tools=TOOLS,
    )
    assert body["messages"][1]["content"] == [
        {"reasoningContent": {"reasoningText": {"text": "Let me look.", "signature": "Eu0CCkgIBxAB"}}},
        {"reasoningContent": {"redactedContent": "AQIDBA=="}},
        {"toolUse": {"toolUseId": "tooluse_1", "name": "get_temperature", "input": {}}},
    ]
