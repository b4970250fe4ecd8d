"""Chat on Bedrock's ConverseStream: the recorded streams (text, `toolUse` input deltas) as chat chunks
(tests/fixtures/SOURCES.md). Frames the recordings lack (arguments in several pieces, two tools, exception
frames) are built with tests/helpers/eventstream.py, which test_bedrock_eventstream.py proves byte-exact on a
recorded frame."""

from __future__ import annotations

import pytest

from tests.helpers.eventstream import event, exception, split_frames
from tests.helpers.recordings import fixture_bytes
from tests.providers.bedrock_setup import chat_chunks, frame_payloads, streamed_calls
from wire.errors import UpstreamStatusError


def test_recorded_tool_use_stream() -> None:
    raw = fixture_bytes("bedrock/converse_stream_tool_use.eventstream")
    chunks = chat_chunks(raw)
    events = frame_payloads(raw)
    text = "".join(e["delta"].get("text", "") for e in events if "delta" in e)
    start = next(e["start"]["toolUse"] for e in events if "start" in e)
    pieces = "".join(e["delta"]["toolUse"]["input"] for e in events if "toolUse" in e.get("delta", {}))

    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert streamed_calls(chunks) == {0: [start["toolUseId"], start["name"], pieces]}
    assert pieces == '{"city":"Paris"}'
    finish = chunks[-2]
    assert finish.choices[0].finish_reason == "tool_calls" and finish.usage is None
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert (last.usage.prompt_tokens, last.usage.completion_tokens, last.usage.total_tokens) == (471, 91, 562)
    assert {c.id for c in chunks} == {"chatcmpl-b"}


def test_recorded_text_stream() -> None:
    chunks = chat_chunks(fixture_bytes("bedrock/converse_stream.eventstream"))
    content = [c for c in chunks if c.choices]
    assert content[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in content][-2:] == [None, "stop"]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 82


def _two_tools_stream(a: list[str], b: list[str]) -> bytes:
    frames = [event("messageStart", {"role": "assistant"})]
    frames.append(event("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": "Checking."}}))
    frames.append(event("contentBlockStop", {"contentBlockIndex": 0}))
    for index, (name, pieces) in enumerate((("get_capital", a), ("get_temperature", b)), start=1):
        use = {"toolUse": {"toolUseId": f"tooluse_{index}", "name": name}}
        frames.append(event("contentBlockStart", {"contentBlockIndex": index, "start": use}))
        for piece in pieces:
            frames.append(
                event("contentBlockDelta", {"contentBlockIndex": index, "delta": {"toolUse": {"input": piece}}})
            )
        frames.append(event("contentBlockStop", {"contentBlockIndex": index}))
    frames.append(event("messageStop", {"stopReason": "tool_use"}))
    frames.append(event("metadata", {"usage": {"inputTokens": 10, "outputTokens": 20, "totalTokens": 30}}))
    return b"".join(frames)


def test_argument_pieces_arrive_byte_for_byte_per_tool() -> None:
    a = ['{"coun', 'try": ', '"Fran', 'ce"}']
    b = ["{", '"city":"Par', 'is \\u00e9"', "}"]
    chunks = chat_chunks(_two_tools_stream(a, b))
    assert streamed_calls(chunks) == {
        0: ["tooluse_1", "get_capital", "".join(a)],
        1: ["tooluse_2", "get_temperature", "".join(b)],
    }
    # One chunk per piece, in the upstream's order.
    pieces = [
        tc.function.arguments
        for c in chunks
        for tc in (c.choices[0].delta.tool_calls or () if c.choices else ())
        if tc.function and tc.function.arguments
    ]
    assert pieces == a + b


def test_an_exception_frame_mid_stream_raises_its_error() -> None:
    frames = split_frames(fixture_bytes("bedrock/converse_stream.eventstream"))
    raw = frames[0] + frames[1] + exception("throttlingException", "Too many requests")
    with pytest.raises(UpstreamStatusError) as caught:
        chat_chunks(raw)
    assert caught.value.upstream_status == 429
    assert caught.value.code == "ThrottlingException"


def test_a_guardrail_stop_is_content_filter() -> None:
    raw = b"".join(
        [
            event("messageStart", {"role": "assistant"}),
            event("messageStop", {"stopReason": "guardrail_intervened"}),
        ]
    )
    assert chat_chunks(raw)[-1].choices[0].finish_reason == "content_filter"
