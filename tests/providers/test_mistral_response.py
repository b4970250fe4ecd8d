"""Mistral: normalization of real recordings.

Recordings: tests/fixtures/mistral (see SOURCES.md) and a streamed chat quoted from a public cassette.
No FIM response was ever recorded: its test parses the SDK-typed shape and says so.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.upstream.framing import SSEDecoder
from providers.base import CallContext
from tests.helpers.adapters import as_json, chunked, context
from tests.helpers.recordings import fixture_bytes, fixture_json
from tests.providers.mistral_setup import ADAPTER, PROMPT, encode
from wire.errors import UpstreamStatusError

CHAT = "mistral/chat_with_ratelimit_headers.json"


# traceloop/openllmetry @45af4941301c packages/opentelemetry-instrumentation-mistralai/tests/cassettes/test_chat/
# test_mistralai_streaming_chat_legacy.yaml (#0): the first ten and the last three events of the recorded
# stream plus its end marker, verbatim after YAML decoding (the content events in between are left out).
_ID = '"id":"6dc321029f5d4aa5899c1b38c9657a61","object":"chat.completion.chunk","created":1757759492'
STREAM_EVENTS: list[bytes] = [
    (
        "data: {" + _ID + ',"model":"mistral-tiny","choices":[{"index":0,"delta":{"role":"assistant","content":""},'
        '"finish_reason":null}]}'
    ).encode(),
    *(
        (
            "data: {"
            + _ID
            + ',"model":"mistral-tiny","choices":[{"index":0,"delta":{"content":'
            + json.dumps(text)
            + '},"finish_reason":null}],"p":"'
            + pad
            + '"}'
        ).encode()
        for text, pad in [
            ("Here", "abcdefghijklmnopqrstuvwxyz01234"),
            ("'", "abcde"),
            ("s", "abcdefghijklmnopqr"),
            (" a", "abcdefghijkl"),
            (" light", "abcdefghijklm"),
            ("-", "abcdefghijklm"),
            ("heart", "abcdefghijklmn"),
            ("ed", "abcdefghijklmnopqrs"),
            (" joke", "abcdefghijklm"),
            (" face", "abcdefghijklmnopqrstuvwxyz012345"),
            (".)", "abcdefghijk"),
        ]
    ),
    (
        "data: {"
        + _ID
        + ',"model":"mistral-tiny","choices":[{"index":0,"delta":{"content":""},"finish_reason":"stop"}],'
        '"usage":{"prompt_tokens":11,"total_tokens":91,"completion_tokens":80},"p":"abcdefghijklmnopqrst"}'
    ).encode(),
    b"data: [DONE]",
]
STREAM_TEXTS = ["Here", "'", "s", " a", " light", "-", "heart", "ed", " joke", " face", ".)"]


def with_choice(**changes: Any) -> bytes:
    """The recorded chat completion with its one choice changed (documented fields only)."""
    body = fixture_json(CHAT)
    body["choices"][0].update(changes)
    return encode(body)


# -- responses -------------------------------------------------------------------------------------


def test_recording_normalizes_to_our_completion() -> None:
    recorded = fixture_json(CHAT)
    out = ADAPTER.parse_response(fixture_bytes(CHAT), context([PROMPT]))
    assert as_json(out) == {
        "object": "text_completion",
        "id": "cmpl-gateway-test-id",
        "created": 1757759489,
        "model": "client/model-string",
        "choices": [
            {
                "text": recorded["choices"][0]["message"]["content"],
                "index": 0,
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 11, "completion_tokens": 96, "total_tokens": 107},
    }
    assert out.choices[0].text.startswith("Here's a light-hearted, tech-themed joke related to OpenTelemetry:")


@pytest.mark.parametrize("size", [1, 9, 100, 65536])
def test_recorded_stream_in_odd_sized_chunks(size: int) -> None:
    raw = b"".join(e + b"\n\n" for e in STREAM_EVENTS)
    decoder = SSEDecoder()
    pairs: list[tuple[str | None, bytes]] = []
    for piece in chunked(raw, size):
        pairs += decoder.feed(piece)
    pairs += decoder.close()
    assert len(pairs) == len(STREAM_EVENTS)
    ctx = context([PROMPT])
    parsed = [ADAPTER.parse_event(name, data, ctx) for name, data in pairs]
    # The role-only opening chunk and `[DONE]` produce nothing.
    assert parsed[0] is None and parsed[-1] is None
    chunks = [as_json(c) for c in parsed[1:-1] if c is not None]
    assert [c["choices"][0]["text"] for c in chunks] == [*STREAM_TEXTS, ""]
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * len(STREAM_TEXTS) + ["stop"]
    assert [c.get("usage") for c in chunks] == [None] * len(STREAM_TEXTS) + [
        {"prompt_tokens": 11, "completion_tokens": 80, "total_tokens": 91}
    ]
    assert {c["created"] for c in chunks} == {1757759492}
    assert all("p" not in c for c in chunks)


@pytest.mark.parametrize(
    "raw,expected", [("stop", "stop"), ("length", "length"), ("model_length", "length"), ("tool_calls", "stop")]
)
def test_finish_reasons(raw: str, expected: str) -> None:
    out = ADAPTER.parse_response(with_choice(finish_reason=raw), context([PROMPT]))
    assert out.choices[0].finish_reason == expected


def test_finish_reason_error_is_an_upstream_failure() -> None:
    with pytest.raises(UpstreamStatusError) as info:
        ADAPTER.parse_response(with_choice(finish_reason="error"), context([PROMPT]))
    assert info.value.retryable
    assert info.value.status == 502
    last = json.loads(STREAM_EVENTS[-2][len(b"data: ") :])
    last["choices"][0]["finish_reason"] = "error"
    with pytest.raises(UpstreamStatusError):
        ADAPTER.parse_event(None, encode(last), context([PROMPT]))


def test_content_chunks_keep_only_text() -> None:
    # Documented shape (AssistantMessage.content may be a list of ContentChunk): reasoning models send
    # `thinking` chunks before the `text` ones.
    content = [
        {"type": "thinking", "thinking": [{"type": "text", "text": "A pun on traces."}]},
        {"type": "text", "text": "Why did the span "},
        {"type": "text", "text": "cross the road?"},
    ]
    out = ADAPTER.parse_response(with_choice(message={"role": "assistant", "content": content}), context([PROMPT]))
    assert out.choices[0].text == "Why did the span cross the road?"


def test_null_content() -> None:
    out = ADAPTER.parse_response(with_choice(message={"role": "assistant", "content": None}), context([PROMPT]))
    assert out.choices[0].text == ""


def test_fim_response_is_parsed_as_the_sdk_types_it() -> None:
    # NOT a recording: no FIM response was ever recorded. client-python types FIMCompletionResponse as
    # {id, object, model, usage, created, choices: ChatCompletionChoice[]}; this is the recorded chat body
    # relabelled with the FIM model, to pin that the chat shape is what the adapter reads.
    body = fixture_json(CHAT)
    body["model"] = "codestral-latest"
    body["choices"][0]["message"]["content"] = "    return n if n < 2 else fib(n - 1) + fib(n - 2)"
    out = ADAPTER.parse_response(encode(body), context(["def fib(n):\n"]))
    assert out.choices[0].text == "    return n if n < 2 else fib(n - 1) + fib(n - 2)"
    assert out.choices[0].finish_reason == "stop"


def test_cached_tokens_when_reported() -> None:
    # Not recorded for Mistral: the OpenAI-style prompt_tokens_details is read if it ever appears.
    body = fixture_json(CHAT)
    body["usage"]["prompt_tokens_details"] = {"cached_tokens": 8}
    out = as_json(ADAPTER.parse_response(encode(body), context([PROMPT])))
    assert out["usage"] == {
        "prompt_tokens": 11,
        "completion_tokens": 96,
        "total_tokens": 107,
        "prompt_tokens_details": {"cached_tokens": 8},
    }


def test_a_reasoning_models_content_chunks_on_chat() -> None:
    # Magistral answers its content as chunks: a `thinking` chunk (holding text chunks), then `text`. The
    # thinking is `reasoning_content`, the text the content, plain and streamed (recordings in SOURCES.md).
    recorded = fixture_json("mistral/chat_magistral_thinking.json")["choices"][0]["message"]["content"]
    thinking = "".join(t["text"] for c in recorded if c["type"] == "thinking" for t in c["thinking"])
    text = "".join(c["text"] for c in recorded if c["type"] == "text")
    ctx = CallContext(id="chatcmpl-m", created=1, model="mistral/x", chat=True)
    answer = ADAPTER.parse_chat_response(fixture_bytes("mistral/chat_magistral_thinking.json"), ctx)
    message = answer.choices[0].message
    assert (message.reasoning_content, message.content) == (thinking, text) and thinking and text
    raw = fixture_bytes("mistral/chat_stream_magistral_thinking.sse.txt")
    decoder = SSEDecoder(max_event_bytes=1 << 20)
    chunks = [c for e, d in [*decoder.feed(raw), *decoder.close()] if (c := ADAPTER.parse_chat_event(e, d, ctx))]
    events = [json.loads(line[6:]) for line in raw.decode().splitlines() if line.startswith("data: {")]
    pieces = [e["choices"][0]["delta"].get("content") for e in events if e["choices"]]
    want_thought = "".join(t["text"] for p in pieces if isinstance(p, list) for c in p for t in c["thinking"])
    want_text = "".join(p for p in pieces if isinstance(p, str))
    got_thought = "".join(c.choices[0].delta.reasoning_content or "" for c in chunks if c.choices)
    got_text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert (got_thought, got_text) == (want_thought, want_text)
    assert got_thought.startswith("Okay, the user is asking") and got_text.startswith("To cross the street")
    assert all(c.choices[0].delta.content is None for c in chunks if c.choices and c.choices[0].delta.reasoning_content)
