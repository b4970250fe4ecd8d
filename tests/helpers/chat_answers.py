"""What a client of the chat route should read from each recorded provider answer: the text, each tool
call's id, name and arguments, OpenAI's finish reason and the usage, taken from the recording itself in
the provider's own wire (tests/fixtures/SOURCES.md). Used by tests/native/test_chat_matrix.py."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tests.helpers.eventstream import split_frames
from tests.helpers.recordings import fixture_bytes, fixture_json, sse_events


@dataclass(frozen=True)
class Want:
    """The answer as a client reads it: text, tool calls (id or None when the provider gives none, name,
    arguments), OpenAI's finish reason, usage (prompt, completion, total)."""

    content: str | None
    calls: list[tuple[str | None, str, str]]
    finish: str
    usage: tuple[int, int, int] | None


def openai_plain(rel: str) -> Want:
    body = fixture_json(rel)
    choice, usage = body["choices"][0], body["usage"]
    calls = [
        (c["id"], c["function"]["name"], c["function"]["arguments"]) for c in choice["message"].get("tool_calls") or ()
    ]
    return Want(
        choice["message"]["content"],
        calls,
        choice["finish_reason"],
        (usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]),
    )


def joined(deltas: list[tuple[int, str | None, str | None, str]]) -> list[tuple[str | None, str, str]]:
    slots: dict[int, list[Any]] = {}
    for index, call_id, name, piece in deltas:
        slot = slots.setdefault(index, [None, "", ""])
        slot[0] = slot[0] or call_id
        slot[1] += name or ""
        slot[2] += piece
    return [(s[0], s[1], s[2]) for _, s in sorted(slots.items())]


def openai_stream(rel: str, usage: tuple[int, int, int] | None) -> Want:
    text, finish, deltas = "", "", []
    for event in sse_events(fixture_bytes(rel)):
        data = event.split(b"data:", 1)[1].strip()
        if data == b"[DONE]":
            continue
        for choice in json.loads(data)["choices"]:
            text += choice["delta"].get("content") or ""
            finish = choice.get("finish_reason") or finish
            for tc in choice["delta"].get("tool_calls") or ():
                fn = tc.get("function") or {}
                deltas.append((tc["index"], tc.get("id"), fn.get("name"), fn.get("arguments") or ""))
    return Want(text or None, joined(deltas), finish, usage)


def named_events(rel: str) -> list[dict[str, Any]]:
    return [json.loads(e.split(b"data:", 1)[1]) for e in sse_events(fixture_bytes(rel)) if b"data:" in e]


def anthropic_plain(rel: str, finish: str) -> Want:
    body = fixture_json(rel)
    text = "".join(b["text"] for b in body["content"] if b["type"] == "text")
    calls = [
        (b["id"], b["name"], json.dumps(b["input"], separators=(",", ":")))
        for b in body["content"]
        if b["type"] == "tool_use"
    ]
    u = body["usage"]
    return Want(text, calls, finish, (u["input_tokens"], u["output_tokens"], u["input_tokens"] + u["output_tokens"]))


def anthropic_stream(rel: str, finish: str) -> Want:
    text, deltas, usage = "", [], [0, 0]
    for e in named_events(rel):
        if e["type"] == "message_start":
            usage[0] = e["message"]["usage"]["input_tokens"]
        elif e["type"] == "content_block_start" and e["content_block"]["type"] == "tool_use":
            deltas.append((e["index"], e["content_block"]["id"], e["content_block"]["name"], ""))
        elif e["type"] == "content_block_delta" and e["delta"]["type"] == "text_delta":
            text += e["delta"]["text"]
        elif e["type"] == "content_block_delta" and e["delta"]["type"] == "input_json_delta":
            deltas.append((e["index"], None, None, e["delta"]["partial_json"]))
        elif e["type"] == "message_delta":
            usage[1] = e["usage"]["output_tokens"]
    return Want(text, joined(deltas), finish, (usage[0], usage[1], usage[0] + usage[1]))


def gemini_parts(candidate: dict[str, Any]) -> tuple[str, list[tuple[str | None, str, str]]]:
    parts = candidate.get("content", {}).get("parts", [])
    text = "".join(p.get("text", "") for p in parts if not p.get("thought"))
    calls: list[tuple[str | None, str, str]] = [
        (None, p["functionCall"]["name"], json.dumps(p["functionCall"]["args"], separators=(",", ":")))
        for p in parts
        if "functionCall" in p
    ]
    return text, calls


def gemini_plain(rel: str, finish: str, usage: tuple[int, int, int]) -> Want:
    text, calls = gemini_parts(fixture_json(rel)["candidates"][0])
    return Want(text or None, calls, finish, usage)


def gemini_stream(rel: str, finish: str, usage: tuple[int, int, int]) -> Want:
    text, calls = "", list[tuple[str | None, str, str]]()
    for e in named_events(rel):
        more, more_calls = gemini_parts(e["candidates"][0])
        text, calls = text + more, calls + more_calls
    return Want(text or None, calls, finish, usage)


def cohere_plain(rel: str, finish: str, usage: tuple[int, int, int]) -> Want:
    message = fixture_json(rel)["message"]
    text = "".join(c["text"] for c in message.get("content") or () if c["type"] == "text")
    calls = [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls") or ()]
    return Want(text or None, calls, finish, usage)


def cohere_stream(rel: str, finish: str, usage: tuple[int, int, int]) -> Want:
    text, deltas = "", []
    for e in named_events(rel):
        message = e.get("delta", {}).get("message", {})
        if e["type"] == "content-delta":
            text += message["content"]["text"]
        elif e["type"] == "tool-call-start":
            call = message["tool_calls"]
            deltas.append((e["index"], call["id"], call["function"]["name"], call["function"].get("arguments", "")))
        elif e["type"] == "tool-call-delta":
            deltas.append((e["index"], None, None, message["tool_calls"]["function"]["arguments"]))
    return Want(text or None, joined(deltas), finish, usage)


def bedrock_plain(rel: str, finish: str) -> Want:
    body = fixture_json(rel)
    blocks = body["output"]["message"]["content"]
    text = "".join(b.get("text", "") for b in blocks)
    calls = [
        (b["toolUse"]["toolUseId"], b["toolUse"]["name"], json.dumps(b["toolUse"]["input"], separators=(",", ":")))
        for b in blocks
        if "toolUse" in b
    ]
    u = body["usage"]
    return Want(text or None, calls, finish, (u["inputTokens"], u["outputTokens"], u["totalTokens"]))


def frame_event(raw: bytes) -> tuple[str, dict[str, Any]]:
    """An event-stream frame's `:event-type` and JSON payload (layout: tests/helpers/eventstream.py)."""
    total, headers_len = struct.unpack_from(">II", raw)
    headers, i, event_type = raw[12 : 12 + headers_len], 0, ""
    while i < len(headers):
        name_len = headers[i]
        name = headers[i + 1 : i + 1 + name_len].decode()
        (value_len,) = struct.unpack_from(">H", headers, i + 2 + name_len)
        value = headers[i + 4 + name_len : i + 4 + name_len + value_len].decode()
        event_type = value if name == ":event-type" else event_type
        i += 4 + name_len + value_len
    return event_type, json.loads(raw[12 + headers_len : total - 4])


def bedrock_stream(rel: str, finish: str) -> Want:
    text, deltas, usage = "", [], (0, 0, 0)
    for event_type, payload in (frame_event(f) for f in split_frames(fixture_bytes(rel))):
        if event_type == "contentBlockStart" and "toolUse" in payload["start"]:
            start = payload["start"]["toolUse"]
            deltas.append((payload["contentBlockIndex"], start["toolUseId"], start["name"], ""))
        elif event_type == "contentBlockDelta" and "text" in payload["delta"]:
            text += payload["delta"]["text"]
        elif event_type == "contentBlockDelta" and "toolUse" in payload["delta"]:
            deltas.append((payload["contentBlockIndex"], None, None, payload["delta"]["toolUse"]["input"]))
        elif event_type == "metadata":
            u = payload["usage"]
            usage = (u["inputTokens"], u["outputTokens"], u["totalTokens"])
    return Want(text or None, joined(deltas), finish, usage)


# Usage where the provider's own fields need a rule: Gemini's completion count holds its thoughts
# (candidates + thoughts, so the three add up to totalTokenCount); Cohere's are `usage.billed_units`, as
# on completions (providers/cohere.py). A stream whose recording reports no usage gets no usage chunk.
OPENAI_CASES: dict[str, tuple[Callable[[], Want], str]] = {
    "text": (lambda: openai_plain("openai/chat_completion.json"), "openai/chat_completion.json"),
    "text_stream": (
        lambda: openai_stream("fireworks/chat_stream_via_hf_router.sse.txt", (46, 20, 66)),
        "fireworks/chat_stream_via_hf_router.sse.txt",
    ),
    "tool": (lambda: openai_plain("openai/chat_tool_calls.json"), "openai/chat_tool_calls.json"),
    "tool_stream": (
        lambda: openai_stream("openai/chat_stream_tool_calls_parallel.sse.txt", None),
        "openai/chat_stream_tool_calls_parallel.sse.txt",
    ),
    "json": (lambda: openai_plain("openai/chat_json_schema.json"), "openai/chat_json_schema.json"),
}
NATIVE_CASES: dict[str, dict[str, tuple[Callable[[], Want], str]]] = {
    "anthropic": {
        "text": (
            lambda: anthropic_plain("anthropic/messages_end_turn.json", "stop"),
            "anthropic/messages_end_turn.json",
        ),
        "text_stream": (
            lambda: anthropic_stream("anthropic/messages_stream.sse.txt", "stop"),
            "anthropic/messages_stream.sse.txt",
        ),
        "tool": (
            lambda: anthropic_plain("anthropic/messages_tool_use.json", "tool_calls"),
            "anthropic/messages_tool_use.json",
        ),
        "tool_stream": (
            lambda: anthropic_stream("anthropic/messages_stream_tool_use.sse.txt", "tool_calls"),
            "anthropic/messages_stream_tool_use.sse.txt",
        ),
    },
    "gemini": {
        "text": (
            lambda: gemini_plain("gemini/generate_content_stop_sequence.json", "stop", (25, 8, 33)),
            "gemini/generate_content_stop_sequence.json",
        ),
        "text_stream": (
            lambda: gemini_stream("gemini/stream_generate_content.sse.txt", "stop", (13, 8, 21)),
            "gemini/stream_generate_content.sse.txt",
        ),
        "tool": (
            lambda: gemini_plain("gemini/generate_content_function_args.json", "tool_calls", (723, 172, 895)),
            "gemini/generate_content_function_args.json",
        ),
        "tool_stream": (
            lambda: gemini_stream("gemini/stream_function_call.sse.txt", "tool_calls", (29, 120, 149)),
            "gemini/stream_function_call.sse.txt",
        ),
        "json": (
            lambda: gemini_plain("gemini/generate_content_json_schema.json", "stop", (8, 20, 28)),
            "gemini/generate_content_json_schema.json",
        ),
    },
    "cohere": {
        "text": (
            lambda: cohere_plain("cohere/v2_chat_stop_sequence.json", "stop", (25, 9, 34)),
            "cohere/v2_chat_stop_sequence.json",
        ),
        "text_stream": (
            lambda: cohere_stream("cohere/v2_chat_stream_text.sse.txt", "length", (20, 4, 24)),
            "cohere/v2_chat_stream_text.sse.txt",
        ),
        "tool": (
            lambda: cohere_plain("cohere/v2_chat_tool_call.json", "tool_calls", (35, 22, 57)),
            "cohere/v2_chat_tool_call.json",
        ),
        "tool_stream": (
            lambda: cohere_stream("cohere/v2_chat_stream_tool_calls.sse.txt", "tool_calls", (37, 28, 65)),
            "cohere/v2_chat_stream_tool_calls.sse.txt",
        ),
        # No Cohere answer to a JSON request was ever published: the recorded text answer stands in for
        # it, and the JSON cell checks the request's translation and that the text is relayed as it is.
        "json": (
            lambda: cohere_plain("cohere/v2_chat_stop_sequence.json", "stop", (25, 9, 34)),
            "cohere/v2_chat_stop_sequence.json",
        ),
    },
    "bedrock": {
        "text": (lambda: bedrock_plain("bedrock/converse_end_turn.json", "stop"), "bedrock/converse_end_turn.json"),
        "text_stream": (
            lambda: bedrock_stream("bedrock/converse_stream.eventstream", "stop"),
            "bedrock/converse_stream.eventstream",
        ),
        "tool": (
            lambda: bedrock_plain("bedrock/converse_tool_use.json", "tool_calls"),
            "bedrock/converse_tool_use.json",
        ),
        "tool_stream": (
            lambda: bedrock_stream("bedrock/converse_stream_tool_use.eventstream", "tool_calls"),
            "bedrock/converse_stream_tool_use.eventstream",
        ),
        "json": (
            lambda: bedrock_plain("bedrock/converse_json_schema.json", "stop"),
            "bedrock/converse_json_schema.json",
        ),
    },
}
