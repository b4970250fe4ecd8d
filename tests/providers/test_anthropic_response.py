"""Anthropic Messages: responses and streams normalized from the real recordings in tests/fixtures/anthropic
(pydantic-ai cassettes, see SOURCES.md)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.upstream.framing import SSEDecoder
from providers.anthropic import AUsage, usage_from
from tests.helpers.adapters import as_json, chunked, context
from tests.helpers.recordings import fixture_bytes, fixture_json
from tests.providers.anthropic_setup import ADAPTER
from wire.errors import UpstreamStatusError
from wire.schema import Completion

STREAM = "anthropic/messages_stream.sse.txt"


# --- responses (real recordings) -------------------------------------------------------------------


def test_end_turn_recording() -> None:
    ctx = context(["What is the capital of France?"])
    out = ADAPTER.parse_response(fixture_bytes("anthropic/messages_end_turn.json"), ctx)
    assert as_json(out) == {
        "object": "text_completion",
        "id": "cmpl-gateway-test-id",
        "created": 1_700_000_000,
        "model": "client/model-string",
        "choices": [{"text": "The capital of France is Paris.", "index": 0, "logprobs": None, "finish_reason": "stop"}],
        "usage": {
            "prompt_tokens": 20,
            "completion_tokens": 10,
            "total_tokens": 30,
            "prompt_tokens_details": {"cached_tokens": 0},
        },
    }


def test_stop_sequence_recording_text_stops_before_the_stop_string() -> None:
    ctx = context()
    out = ADAPTER.parse_response(fixture_bytes("anthropic/messages_stop_sequence.json"), ctx)
    assert as_json(out)["choices"] == [
        {"text": "The beautiful city of ", "index": 0, "logprobs": None, "finish_reason": "stop"}
    ]
    assert as_json(out)["usage"] == {
        "prompt_tokens": 32,
        "completion_tokens": 5,
        "total_tokens": 37,
        "prompt_tokens_details": {"cached_tokens": 0},
    }


@pytest.mark.parametrize(
    "stop_reason,expected",
    [
        ("end_turn", "stop"),
        ("stop_sequence", "stop"),
        ("pause_turn", "stop"),
        ("tool_use", "stop"),
        ("max_tokens", "length"),
        ("model_context_window_exceeded", "length"),
        ("refusal", "content_filter"),
    ],
)
def test_every_documented_stop_reason(stop_reason: str, expected: str) -> None:
    rec = fixture_json("anthropic/messages_end_turn.json")
    rec["stop_reason"] = stop_reason
    out = ADAPTER.parse_response(json.dumps(rec).encode(), context())
    assert out.choices[0].finish_reason == expected


def test_cache_reads_and_writes_count_as_prompt_tokens() -> None:
    usage = usage_from(
        AUsage(input_tokens=3, output_tokens=7, cache_creation_input_tokens=50, cache_read_input_tokens=100)
    )
    assert as_json(usage) == {
        "prompt_tokens": 153,
        "completion_tokens": 7,
        "total_tokens": 160,
        "prompt_tokens_details": {"cached_tokens": 100},
    }
    # Without cache fields (older API versions) there is nothing to report as cached.
    assert as_json(usage_from(AUsage(input_tokens=3, output_tokens=7))) == {
        "prompt_tokens": 3,
        "completion_tokens": 7,
        "total_tokens": 10,
    }


# --- the recorded stream ---------------------------------------------------------------------------


def _events(raw: bytes, size: int) -> list[tuple[str | None, bytes]]:
    decoder = SSEDecoder()
    return [e for part in chunked(raw, size) for e in decoder.feed(part)] + decoder.close()


@pytest.mark.parametrize("size", [1, 2, 5, 17, 64, 333, 100_000])
def test_recorded_stream_in_odd_chunks(size: int) -> None:
    events = _events(fixture_bytes(STREAM), size)
    assert [name for name, _ in events] == [
        "message_start",
        "content_block_start",
        "ping",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    ctx = context(["What is 1+1?"])
    parsed = [ADAPTER.parse_event(name, data, ctx) for name, data in events]
    assert [p is None for p in parsed] == [True, True, True, False, True, False, True]
    text, last = parsed[3], parsed[5]
    assert text is not None and last is not None
    assert as_json(text) == {
        "object": "text_completion",
        "id": "cmpl-gateway-test-id",
        "created": 1_700_000_000,
        "model": "client/model-string",
        "choices": [{"text": "2", "index": 0, "logprobs": None, "finish_reason": None}],
    }
    # The last chunk carries the finish reason and the whole usage.
    assert as_json(last) == {
        "object": "text_completion",
        "id": "cmpl-gateway-test-id",
        "created": 1_700_000_000,
        "model": "client/model-string",
        "choices": [{"text": "", "index": 0, "logprobs": None, "finish_reason": "stop"}],
        "usage": {
            "prompt_tokens": 20,
            "completion_tokens": 5,
            "total_tokens": 25,
            "prompt_tokens_details": {"cached_tokens": 0},
        },
    }


def _event_payloads() -> dict[str, dict[str, Any]]:
    return {name or "": json.loads(data) for name, data in _events(fixture_bytes(STREAM), 4096)}


def test_message_delta_without_input_counts_keeps_message_start_counts() -> None:
    # Older API versions sent only output_tokens in message_delta: the recorded event minus the rest.
    payloads = _event_payloads()
    start, delta = payloads["message_start"], payloads["message_delta"]
    start["message"]["usage"]["input_tokens"] = 12
    start["message"]["usage"]["cache_read_input_tokens"] = 8
    delta["usage"] = {"output_tokens": 5}
    ctx = context()
    assert ADAPTER.parse_event("message_start", json.dumps(start).encode(), ctx) is None
    last = ADAPTER.parse_event("message_delta", json.dumps(delta).encode(), ctx)
    assert last is not None
    assert as_json(last.usage) == {
        "prompt_tokens": 20,
        "completion_tokens": 5,
        "total_tokens": 25,
        "prompt_tokens_details": {"cached_tokens": 8},
    }


def test_events_are_told_apart_by_their_json_type_without_event_lines() -> None:
    ctx = context()
    parsed = [ADAPTER.parse_event(None, data, ctx) for _, data in _events(fixture_bytes(STREAM), 4096)]
    chunks = [c for c in parsed if c is not None]
    assert [(c.choices[0].text, c.choices[0].finish_reason) for c in chunks] == [("2", None), ("", "stop")]


def test_thinking_deltas_are_not_completion_text() -> None:
    delta = _event_payloads()["content_block_delta"]
    delta["delta"] = {"type": "thinking_delta", "thinking": "Let me add."}
    assert ADAPTER.parse_event("content_block_delta", json.dumps(delta).encode(), context()) is None


def test_error_event_mid_stream_raises_the_mapped_error() -> None:
    # The error event of Anthropic's streaming docs ("Error events"): an overloaded_error after a 200.
    data = b'{"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}'
    with pytest.raises(UpstreamStatusError) as info:
        ADAPTER.parse_event("error", data, context())
    err = info.value
    assert err.upstream_status == 529
    assert (err.status, err.type) == (502, "upstream_error")
    assert err.code == "overloaded_error"
    assert err.message == "anthropic error (529): Overloaded"
    assert err.retryable is True


def _stream_result(raw: bytes) -> list[Completion]:
    ctx = context()
    out = [ADAPTER.parse_event(name, data, ctx) for name, data in _events(raw, 7)]
    return [c for c in out if c is not None]


def test_recorded_stream_text_equals_the_sum_of_deltas() -> None:
    chunks = _stream_result(fixture_bytes(STREAM))
    assert "".join(c.choices[0].text for c in chunks) == "2"
    assert chunks[-1].usage is not None and all(c.usage is None for c in chunks[:-1])
