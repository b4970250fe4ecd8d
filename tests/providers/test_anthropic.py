"""Anthropic Messages: requests translated field by field; responses, streams and errors normalized from the
real recordings in tests/fixtures/anthropic (pydantic-ai cassettes, see SOURCES.md)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import msgspec
import pytest

from gateway.upstream.framing import SSEDecoder
from providers import REGISTRY
from providers.anthropic import DEFAULT_MAX_TOKENS, AnthropicAdapter, AUsage, reset_hint, usage_from
from providers.base import PARAM_FIELDS, Endpoint, map_params
from tests.helpers.adapters import NATIVE, SAMPLE, as_json, build, chunked, context, request, sample
from tests.helpers.recordings import fixture_bytes, fixture_json
from wire.errors import MAX_RETRY_AFTER_S, InvalidRequestError, UnsupportedParamError, UpstreamStatusError
from wire.schema import Completion

ADAPTER = AnthropicAdapter()
ENDPOINT = Endpoint(
    provider="claude", model="claude-sonnet-4-5-20250929", base_url="https://api.anthropic.com", api_key="sk-ant-test"
)
HEADERS = {
    "content-type": "application/json",
    "accept": "application/json",
    "anthropic-version": "2023-06-01",
    "x-api-key": "sk-ant-test",
}
STREAM = "anthropic/messages_stream.sse.txt"
ERROR = "anthropic/error_400_invalid_request.json"

EMULATED_FIELDS = (
    "n",
    "best_of",
    "echo",
    "include_stop_str_in_output",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
)
REFUSED: dict[str, Any] = sample(
    "frequency_penalty",
    "presence_penalty",
    "logprobs",
    "suffix",
    "seed",
    "logit_bias",
    "response_format",
    "images",
    "context_length_exceeded_behavior",
    "audio",
    "modalities",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "prediction",
    *NATIVE,
)


def test_registered_under_its_kind() -> None:
    assert REGISTRY["anthropic"] is AnthropicAdapter


def test_every_canonical_field_is_mapped_emulated_or_refused() -> None:
    native = {"max_tokens", "temperature", "top_p", "top_k", "stop", "user"}
    assert set(ADAPTER.params) == native | set(EMULATED_FIELDS)
    assert all(ADAPTER.params[f].emulated for f in EMULATED_FIELDS)
    assert set(PARAM_FIELDS) == native | set(EMULATED_FIELDS) | set(REFUSED)


def test_every_native_field_reaches_the_messages_body() -> None:
    req = request(
        "claude/claude-sonnet-4-5-20250929",
        "What is the capital of France?",
        max_tokens=50,
        temperature=0.5,
        top_p=0.9,
        top_k=40,
        stop=["Paris", "\n\n"],
        user="user-1234",
    )
    up, body, dropped = build(ADAPTER, req, ENDPOINT)
    assert up.method == "POST"
    assert up.url == "https://api.anthropic.com/v1/messages"
    assert up.headers == HEADERS
    assert up.stream is False
    assert dropped == []
    assert body == {
        "model": "claude-sonnet-4-5-20250929",
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "max_tokens": 50,
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 40,
        "stop_sequences": ["Paris", "\n\n"],
        "metadata": {"user_id": "user-1234"},
    }


def test_max_tokens_is_always_sent_request_then_config_then_default() -> None:
    _, body, _ = build(ADAPTER, request(), ENDPOINT)
    assert body["max_tokens"] == DEFAULT_MAX_TOKENS == 4096
    configured = msgspec.structs.replace(ENDPOINT, default_max_tokens=1024)
    assert build(ADAPTER, request(), configured)[1]["max_tokens"] == 1024
    assert build(ADAPTER, request(max_tokens=5), configured)[1]["max_tokens"] == 5
    assert build(ADAPTER, request(max_new_tokens=6), configured)[1]["max_tokens"] == 6


def test_minimal_body() -> None:
    _, body, _ = build(ADAPTER, request(prompt="Hi"), ENDPOINT)
    assert body == {
        "model": "claude-sonnet-4-5-20250929",
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 4096,
    }


def test_top_k_minus_one_means_no_top_k() -> None:
    _, body, _ = build(ADAPTER, request(top_k=-1), ENDPOINT)
    assert "top_k" not in body
    assert build(ADAPTER, request(top_k=0), ENDPOINT)[1]["top_k"] == 0


def test_bare_string_stop_becomes_stop_sequences() -> None:
    _, body, _ = build(ADAPTER, request(stop="\n"), ENDPOINT)
    assert body["stop_sequences"] == ["\n"]
    assert "stop" not in body


def test_stream_flag_and_accept() -> None:
    up, body, _ = build(ADAPTER, request(stream=True, stream_options={"include_usage": True}), ENDPOINT)
    assert up.stream is True
    assert up.headers["accept"] == "text/event-stream"
    # Anthropic always reports usage in the stream: nothing like stream_options goes upstream.
    assert body == {
        "model": "claude-sonnet-4-5-20250929",
        "messages": [{"role": "user", "content": "Say this is a test"}],
        "max_tokens": 4096,
        "stream": True,
    }


def test_api_version_headers_and_extra_params() -> None:
    endpoint = Endpoint(
        provider="claude",
        model="claude-3-opus-20240229",
        base_url="https://proxy.internal/anthropic/",
        api_key="sk-ant-test",
        api_version="2024-01-01",
        headers={"Anthropic-Beta": "prompt-caching-2024-07-31", "x-api-key": "from-config"},
    )
    req = request(
        max_tokens=3,
        temperature=0.1,
        inference_extra_params={"system": "Be brief.", "temperature": 0.5},
        inference_extra_headers={"x-trace-id": "t-1"},
    )
    up, body, _ = build(ADAPTER, req, endpoint)
    assert up.url == "https://proxy.internal/anthropic/v1/messages"
    assert up.headers == {
        "content-type": "application/json",
        "accept": "application/json",
        "anthropic-version": "2024-01-01",
        "anthropic-beta": "prompt-caching-2024-07-31",
        "x-trace-id": "t-1",
        "x-api-key": "sk-ant-test",
    }
    assert body == {
        "model": "claude-3-opus-20240229",
        "messages": [{"role": "user", "content": "Say this is a test"}],
        "max_tokens": 3,
        "temperature": 0.5,
        "system": "Be brief.",
    }


def test_no_key_no_x_api_key() -> None:
    endpoint = Endpoint(provider="claude", model="m", base_url="https://api.anthropic.com")
    up, _, _ = build(ADAPTER, request(), endpoint)
    assert "x-api-key" not in up.headers


@pytest.mark.parametrize("field", EMULATED_FIELDS)
def test_emulated_fields_write_nothing_upstream(field: str) -> None:
    value = SAMPLE[field]
    _, body, dropped = build(ADAPTER, request(**dict[str, Any]({field: value})), ENDPOINT)
    assert dropped == []
    assert body == {
        "model": "claude-sonnet-4-5-20250929",
        "messages": [{"role": "user", "content": "Say this is a test"}],
        "max_tokens": 4096,
    }


@pytest.mark.parametrize("field", sorted(REFUSED))
def test_unsupported_fields_are_refused_naming_field_and_provider(field: str) -> None:
    with pytest.raises(UnsupportedParamError) as info:
        build(ADAPTER, request(**{field: REFUSED[field]}), ENDPOINT)
    assert info.value.status == 400
    assert info.value.param == field
    assert info.value.message == f"Parameter '{field}' is not supported by provider 'claude'"


@pytest.mark.parametrize("logprobs", [0, 3, 5])
def test_logprobs_of_any_count_can_be_dropped_under_the_drop_policy(logprobs: int) -> None:
    _, body, dropped = build(ADAPTER, request(logprobs=logprobs, seed=1), ENDPOINT, drop=True)
    assert dropped == ["logprobs", "seed"]
    assert "logprobs" not in body and "seed" not in body


@pytest.mark.parametrize("temperature", [1.01, 1.5, 2.0])
def test_temperature_above_one_is_refused_not_clamped(temperature: float) -> None:
    with pytest.raises(InvalidRequestError) as info:
        ADAPTER.check(request(temperature=temperature), "claude")
    assert info.value.status == 400
    assert info.value.param == "temperature"
    assert info.value.code == "invalid_value"
    assert info.value.message == f"Provider 'claude' accepts 'temperature' from 0 to 1, got {temperature:g}"


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.0])
def test_temperature_in_range_passes(temperature: float) -> None:
    _, body, _ = build(ADAPTER, request(temperature=temperature), ENDPOINT)
    assert body["temperature"] == temperature


@pytest.mark.parametrize("prompt", [["a", "b"], [1, 2], [[1], [2]]])
def test_only_a_single_text_prompt(prompt: Any) -> None:
    with pytest.raises(UnsupportedParamError) as info:
        ADAPTER.check(request(prompt=prompt), "claude")
    assert info.value.param == "prompt"


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


# --- errors ----------------------------------------------------------------------------------------


def test_error_recording() -> None:
    err = ADAPTER.map_error(400, {"request-id": "req_011Ca7jT9AHpgXgdv8igm4z9"}, fixture_bytes(ERROR), "claude")
    assert isinstance(err, UpstreamStatusError)
    assert (err.status, err.type, err.upstream_status) == (400, "invalid_request_error", 400)
    assert err.message == (
        "claude error (400): This model does not support effort level 'xhigh'. "
        "Supported levels: high, low, max, medium."
    )
    assert err.code == "invalid_request_error"
    assert err.provider == "claude"
    assert err.retry_after is None
    assert (err.retryable, err.quota, err.context_window) == (False, False, False)


def _envelope(kind: str, message: str, **extra: Any) -> bytes:
    """The recorded error envelope with another documented error type and message."""
    rec = fixture_json(ERROR)
    rec["error"] = {"type": kind, "message": message, **extra}
    return json.dumps(rec).encode()


def test_rate_limit_honours_retry_after() -> None:
    body = _envelope("rate_limit_error", "Number of request tokens has exceeded your per-minute rate limit")
    err = ADAPTER.map_error(429, {"retry-after": "12"}, body, "claude")
    assert (err.status, err.type) == (429, "rate_limit_error")
    assert err.retry_after == 12.0
    assert err.retryable is True and err.quota is False
    assert err.code == "rate_limit_error"


def test_spend_limit_is_a_quota_and_never_retried() -> None:
    # The rate-limits page's spend-limit 429: error.details.error_code, and no retry-after.
    body = _envelope(
        "rate_limit_error",
        "You have reached your API usage limits.",
        details={"error_code": "enforced_spend_limit_reached"},
    )
    err = ADAPTER.map_error(429, {}, body, "claude")
    assert err.status == 429
    assert err.quota is True
    assert err.retryable is False
    assert err.code == "enforced_spend_limit_reached"


def test_billing_error_is_a_quota() -> None:
    err = ADAPTER.map_error(402, {}, _envelope("billing_error", "Your credit balance is too low."), "claude")
    assert (err.status, err.quota, err.retryable) == (502, True, False)


def test_overloaded_529_is_retried_unless_told_otherwise() -> None:
    body = _envelope("overloaded_error", "Overloaded")
    err = ADAPTER.map_error(529, {}, body, "claude")
    assert (err.status, err.type, err.retryable) == (502, "upstream_error", True)
    assert ADAPTER.map_error(529, {"x-should-retry": "false"}, body, "claude").retryable is False


@pytest.mark.parametrize(
    "message",
    [
        "prompt is too long: 205000 tokens > 200000 maximum",
        "input length and `max_tokens` exceed context limit: 197779 + 8192 > 200000, "
        "decrease input length or `max_tokens` and try again",
    ],
)
def test_prompt_too_long_is_a_context_window_error(message: str) -> None:
    err = ADAPTER.map_error(400, {}, _envelope("invalid_request_error", message), "claude")
    assert err.context_window is True
    assert err.retryable is False


NOW = datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC).timestamp()


def test_ratelimit_reset_headers_serve_as_the_hint_when_retry_after_is_absent() -> None:
    headers = {
        "anthropic-ratelimit-requests-remaining": "41",
        "anthropic-ratelimit-requests-reset": "2025-01-01T12:00:01Z",
        "anthropic-ratelimit-tokens-remaining": "0",
        "anthropic-ratelimit-tokens-reset": "2025-01-01T12:00:07.5Z",
        "anthropic-ratelimit-input-tokens-remaining": "0",
        "anthropic-ratelimit-input-tokens-reset": "2025-01-01T12:00:04Z",
    }
    # The latest reset among the exhausted limits: both must have replenished.
    assert reset_hint(headers, now=NOW) == 7.5
    # No limit reported exhausted: wait for the latest reset of all.
    assert reset_hint({"anthropic-ratelimit-requests-reset": "2025-01-01T12:00:03+00:00"}, now=NOW) == 3.0
    assert reset_hint({"anthropic-ratelimit-tokens-reset": "2024-12-31T11:00:00Z"}, now=NOW) == 0.0
    assert reset_hint({"anthropic-ratelimit-tokens-reset": "soon"}, now=NOW) is None
    assert reset_hint({}, now=NOW) is None


def test_map_error_uses_the_reset_hint_only_on_429_and_only_without_retry_after() -> None:
    far = "2999-01-01T00:00:00Z"
    headers = {"anthropic-ratelimit-tokens-remaining": "0", "anthropic-ratelimit-tokens-reset": far}
    body = _envelope("rate_limit_error", "slow down")
    hint = ADAPTER.map_error(429, headers, body, "claude").retry_after
    assert hint == MAX_RETRY_AFTER_S  # the year-2999 reset, bounded (wire/errors.py)
    assert ADAPTER.map_error(429, {**headers, "retry-after": "3"}, body, "claude").retry_after == 3.0
    assert ADAPTER.map_error(500, headers, _envelope("api_error", "oops"), "claude").retry_after is None


def test_non_json_error_bodies_keep_their_text() -> None:
    err = ADAPTER.map_error(502, {}, b"<html>Bad Gateway</html>\n", "claude")
    assert err.message == "claude error (502): <html>Bad Gateway</html>"
    assert err.code is None
    assert ADAPTER.map_error(500, {}, b"", "claude").message == "claude error (500): no error body"
    assert ADAPTER.map_error(500, {}, b'{"detail": "x"}', "claude").message == 'claude error (500): {"detail": "x"}'


def test_map_params_directly_names_the_configured_provider() -> None:
    with pytest.raises(UnsupportedParamError) as info:
        map_params(request(seed=1), ADAPTER.params, "my-claude", drop_unsupported=False)
    assert info.value.message == "Parameter 'seed' is not supported by provider 'my-claude'"
