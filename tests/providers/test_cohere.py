"""Cohere v2 Chat: requests translated field by field; the non-stream response normalized from the real
recording tests/fixtures/cohere/v2_chat_stop_sequence.json (pydantic-ai cassette, see SOURCES.md).

No Cohere stream was recorded. The stream tests use only what Cohere documents (docs.cohere.com/v2/docs/
streaming and cohere-python `v2/types/v2chat_stream_response.py`): events named by their JSON `type`, the
text at `delta.message.content.text` of content-delta, and `delta.finish_reason` / `delta.usage` /
`delta.error` of message-end. Error bodies are the documented `{"message": string}` with messages from
docs.cohere.com/reference/errors.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.upstream.framing import SSEDecoder
from providers import REGISTRY
from providers.base import Endpoint
from providers.cohere import CohereAdapter, CTokens, CUsage, usage_from
from tests.helpers.adapters import (
    COMPLETION_FIELDS,
    NATIVE,
    OPENAI_ONLY,
    SAMPLE,
    as_json,
    build,
    chunked,
    context,
    request,
    sample,
)
from tests.helpers.recordings import fixture_bytes, fixture_json
from wire.errors import InvalidRequestError, UnsupportedParamError, UpstreamStatusError

ADAPTER = CohereAdapter()
ENDPOINT = Endpoint(provider="co", model="command-r7b-12-2024", base_url="https://api.cohere.com", api_key="co-test")
HEADERS = {"content-type": "application/json", "accept": "application/json", "authorization": "Bearer co-test"}
RECORDING = "cohere/v2_chat_stop_sequence.json"
BASE_BODY = {"model": "command-r7b-12-2024", "messages": [{"role": "user", "content": "Say this is a test"}]}

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
    "logprobs",
    "suffix",
    "logit_bias",
    "user",
    "response_format",
    "reasoning_effort",
    *OPENAI_ONLY,
    *NATIVE,
)
# Cohere has no logprobs at all, so even 0 (the chosen token's alone) is refused.
REFUSED["logprobs"] = 0


def test_registered_under_its_kind() -> None:
    assert REGISTRY["cohere"] is CohereAdapter


def test_every_canonical_field_is_mapped_emulated_or_refused() -> None:
    native = {"max_tokens", "temperature", "top_p", "top_k", "seed", "frequency_penalty", "presence_penalty", "stop"}
    assert set(ADAPTER.params) == native | set(EMULATED_FIELDS)
    assert all(ADAPTER.params[f].emulated for f in EMULATED_FIELDS)
    assert set(COMPLETION_FIELDS) == native | set(EMULATED_FIELDS) | set(REFUSED)


def test_every_native_field_reaches_the_chat_body() -> None:
    req = request(
        "co/command-r7b-12-2024",
        "What is the capital of France?",
        max_tokens=20,
        temperature=1.3,
        top_p=0.75,
        top_k=40,
        seed=42,
        frequency_penalty=0.25,
        presence_penalty=0.5,
        stop=["Paris"],
    )
    up, body, dropped = build(ADAPTER, req, ENDPOINT)
    assert up.method == "POST"
    assert up.url == "https://api.cohere.com/v2/chat"
    assert up.headers == HEADERS
    assert up.stream is False
    assert dropped == []
    assert body == {
        "model": "command-r7b-12-2024",
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "max_tokens": 20,
        "temperature": 1.3,
        "p": 0.75,
        "k": 40,
        "seed": 42,
        "frequency_penalty": 0.25,
        "presence_penalty": 0.5,
        "stop_sequences": ["Paris"],
    }


def test_minimal_body_sends_no_token_limit() -> None:
    # Cohere defaults max_tokens to the model's own output limit: nothing to invent.
    _, body, _ = build(ADAPTER, request(), ENDPOINT)
    assert body == BASE_BODY


def test_top_k_minus_one_is_cohere_k_zero() -> None:
    assert build(ADAPTER, request(top_k=-1), ENDPOINT)[1]["k"] == 0
    assert build(ADAPTER, request(top_k=500), ENDPOINT)[1]["k"] == 500


def test_bare_string_stop_becomes_stop_sequences() -> None:
    _, body, _ = build(ADAPTER, request(stop="\n"), ENDPOINT)
    assert body == {**BASE_BODY, "stop_sequences": ["\n"]}


def test_stream_flag_and_accept() -> None:
    up, body, _ = build(ADAPTER, request(stream=True, stream_options={"include_usage": True}), ENDPOINT)
    assert up.stream is True
    assert up.headers == {**HEADERS, "accept": "text/event-stream"}
    assert body == {**BASE_BODY, "stream": True}


def test_headers_and_extra_params() -> None:
    endpoint = Endpoint(
        provider="co",
        model="command-a-03-2025",
        base_url="https://proxy.internal/cohere/",
        api_key="co-test",
        headers={"X-Client-Name": "gateway", "authorization": "Bearer from-config"},
    )
    req = request(inference_extra_params={"safety_mode": "OFF"}, inference_extra_headers={"x-trace-id": "t-1"})
    up, body, _ = build(ADAPTER, req, endpoint)
    assert up.url == "https://proxy.internal/cohere/v2/chat"
    assert up.headers == {**HEADERS, "x-client-name": "gateway", "x-trace-id": "t-1"}
    assert body == {
        "model": "command-a-03-2025",
        "messages": [{"role": "user", "content": "Say this is a test"}],
        "safety_mode": "OFF",
    }


def test_no_key_no_authorization() -> None:
    up, _, _ = build(ADAPTER, request(), Endpoint(provider="co", model="m", base_url="https://api.cohere.com"))
    assert "authorization" not in up.headers


@pytest.mark.parametrize("field", EMULATED_FIELDS)
def test_emulated_fields_write_nothing_upstream(field: str) -> None:
    value = SAMPLE[field]
    _, body, dropped = build(ADAPTER, request(**dict[str, Any]({field: value})), ENDPOINT)
    assert dropped == []
    assert body == BASE_BODY


@pytest.mark.parametrize("field", sorted(REFUSED))
def test_unsupported_fields_are_refused_naming_field_and_provider(field: str) -> None:
    with pytest.raises(UnsupportedParamError) as info:
        build(ADAPTER, request(**{field: REFUSED[field]}), ENDPOINT)
    assert info.value.status == 400
    assert info.value.param == field
    assert info.value.message == f"Parameter '{field}' is not supported by provider 'co'"


def test_logprobs_is_refused_at_any_count_and_dropped_under_the_drop_policy() -> None:
    with pytest.raises(UnsupportedParamError) as info:
        build(ADAPTER, request(logprobs=5), ENDPOINT)
    assert info.value.message == "Parameter 'logprobs' is not supported by provider 'co'"
    _, body, dropped = build(ADAPTER, request(logprobs=5), ENDPOINT, drop=True)
    assert dropped == ["logprobs"] and body == BASE_BODY


@pytest.mark.parametrize(
    "field,value,low,high",
    [
        ("frequency_penalty", -0.5, 0, 1),
        ("frequency_penalty", 1.5, 0, 1),
        ("presence_penalty", -0.1, 0, 1),
        ("presence_penalty", 2.0, 0, 1),
        ("top_p", 1.0, 0.01, 0.99),
        ("top_p", 0.0, 0.01, 0.99),
        ("top_k", 501, -1, 500),
    ],
)
def test_values_outside_cohere_ranges_are_refused_not_clamped(
    field: str, value: float, low: float, high: float
) -> None:
    with pytest.raises(InvalidRequestError) as info:
        ADAPTER.check(request(**dict[str, Any]({field: value})), "co")
    assert info.value.status == 400
    assert info.value.param == field
    assert info.value.code == "invalid_value"
    assert info.value.message == f"Provider 'co' accepts '{field}' from {low:g} to {high:g}, got {value:g}"


@pytest.mark.parametrize(
    "field,value",
    [
        ("frequency_penalty", 0.0),
        ("frequency_penalty", 1.0),
        ("presence_penalty", 1.0),
        ("top_p", 0.01),
        ("top_p", 0.99),
    ],
)
def test_range_bounds_pass(field: str, value: float) -> None:
    ADAPTER.check(request(**dict[str, Any]({field: value})), "co")


@pytest.mark.parametrize("prompt", [["a", "b"], [1, 2], [[1], [2]]])
def test_only_a_single_text_prompt(prompt: Any) -> None:
    with pytest.raises(UnsupportedParamError) as info:
        ADAPTER.check(request(prompt=prompt), "co")
    assert info.value.param == "prompt"


# --- the recorded response -------------------------------------------------------------------------


def test_stop_sequence_recording_uses_billed_units_as_usage() -> None:
    out = ADAPTER.parse_response(fixture_bytes(RECORDING), context(["What is the capital of France?"]))
    assert as_json(out) == {
        "object": "text_completion",
        "id": "cmpl-gateway-test-id",
        "created": 1_700_000_000,
        "model": "client/model-string",
        "choices": [
            {"text": "The capital of France is a city known as", "index": 0, "logprobs": None, "finish_reason": "stop"}
        ],
        # billed_units (25 / 9), not tokens (91 / 11, which include Cohere's own preamble).
        "usage": {"prompt_tokens": 25, "completion_tokens": 9, "total_tokens": 34},
    }


@pytest.mark.parametrize(
    "raw,expected",
    [("COMPLETE", "stop"), ("STOP_SEQUENCE", "stop"), ("MAX_TOKENS", "length"), ("TOOL_CALL", "stop")],
)
def test_finish_reasons(raw: str, expected: str) -> None:
    rec = fixture_json(RECORDING)
    rec["finish_reason"] = raw
    assert ADAPTER.parse_response(json.dumps(rec).encode(), context()).choices[0].finish_reason == expected


@pytest.mark.parametrize(
    "raw,upstream,status,kind", [("ERROR", 500, 502, "upstream_error"), ("TIMEOUT", 504, 504, "timeout_error")]
)
def test_failed_generation_raises(raw: str, upstream: int, status: int, kind: str) -> None:
    rec = fixture_json(RECORDING)
    rec["finish_reason"] = raw
    with pytest.raises(UpstreamStatusError) as info:
        ADAPTER.parse_response(json.dumps(rec).encode(), context())
    err = info.value
    assert (err.upstream_status, err.status, err.type) == (upstream, status, kind)
    assert err.message == f"cohere error ({upstream}): the generation ended with finish_reason {raw}"
    assert err.code == raw
    assert err.retryable is True


def test_only_text_content_items_are_the_completion() -> None:
    rec = fixture_json(RECORDING)
    rec["message"]["content"].insert(0, {"type": "thinking", "thinking": "France... Paris."})
    out = ADAPTER.parse_response(json.dumps(rec).encode(), context())
    assert out.choices[0].text == "The capital of France is a city known as"


def test_usage_falls_back_to_tokens_when_billed_units_are_missing() -> None:
    usage = usage_from(CUsage(tokens=CTokens(input_tokens=91, output_tokens=11)))
    assert as_json(usage) == {"prompt_tokens": 91, "completion_tokens": 11, "total_tokens": 102}
    assert usage_from(CUsage()) is None


# --- the stream (documented shape, no recording) ---------------------------------------------------


def _event(kind: str, named: bool, **fields: Any) -> bytes:
    data = json.dumps({"type": kind, **fields}).encode()
    return (f"event: {kind}\n".encode() if named else b"") + b"data: " + data + b"\n\n"


def _documented_stream(named: bool, finish: str = "COMPLETE", error: str | None = None) -> bytes:
    end: dict[str, Any] = {
        "finish_reason": finish,
        "usage": {
            "billed_units": {"input_tokens": 5, "output_tokens": 2},
            "tokens": {"input_tokens": 71, "output_tokens": 3},
        },
    }
    if error is not None:
        end["error"] = error
    return b"".join(
        [
            _event("message-start", named, id="msg-1", delta={"message": {"role": "assistant"}}),
            _event("content-start", named, index=0, delta={"message": {"content": {"type": "text", "text": ""}}}),
            _event("content-delta", named, index=0, delta={"message": {"content": {"text": "Hello"}}}),
            _event("content-delta", named, index=0, delta={"message": {"content": {"text": " there"}}}),
            _event("content-end", named, index=0),
            _event("message-end", named, id="msg-1", delta=end),
        ]
    )


def _parse(raw: bytes, size: int) -> list[Any]:
    decoder = SSEDecoder()
    ctx = context()
    events = [e for part in chunked(raw, size) for e in decoder.feed(part)] + decoder.close()
    return [ADAPTER.parse_event(name, data, ctx) for name, data in events]


@pytest.mark.parametrize("named", [True, False], ids=["event-lines", "data-only"])
@pytest.mark.parametrize("size", [1, 3, 11, 64, 10_000])
def test_documented_stream_in_odd_chunks(named: bool, size: int) -> None:
    parsed = _parse(_documented_stream(named), size)
    assert [p is None for p in parsed] == [True, True, False, False, True, False]
    chunks = [as_json(p) for p in parsed if p is not None]
    envelope = {
        "object": "text_completion",
        "id": "cmpl-gateway-test-id",
        "created": 1_700_000_000,
        "model": "client/model-string",
    }
    assert chunks == [
        {**envelope, "choices": [{"text": "Hello", "index": 0, "logprobs": None, "finish_reason": None}]},
        {**envelope, "choices": [{"text": " there", "index": 0, "logprobs": None, "finish_reason": None}]},
        {
            **envelope,
            "choices": [{"text": "", "index": 0, "logprobs": None, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
        },
    ]


def test_stream_max_tokens_is_length() -> None:
    last = _parse(_documented_stream(True, "MAX_TOKENS"), 4096)[-1]
    assert last is not None and last.choices[0].finish_reason == "length"


def test_stream_error_at_message_end_raises_with_the_documented_error_text() -> None:
    with pytest.raises(UpstreamStatusError) as info:
        _parse(_documented_stream(True, "ERROR", error="internal generation failure"), 4096)
    assert info.value.message == "cohere error (500): internal generation failure"
    assert info.value.status == 502
    assert info.value.retryable is True


def test_thinking_deltas_and_unknown_events_are_skipped() -> None:
    ctx = context()
    thinking = {"type": "content-delta", "delta": {"message": {"content": {"thinking": "hmm"}}}}
    assert ADAPTER.parse_event("content-delta", json.dumps(thinking).encode(), ctx) is None
    assert ADAPTER.parse_event("citation-start", b'{"type": "citation-start", "index": 0}', ctx) is None
    assert ADAPTER.parse_event(None, b"[DONE]", ctx) is None


# --- errors ----------------------------------------------------------------------------------------


def _err(message: str) -> bytes:
    return json.dumps({"message": message}).encode()


def test_bad_request_keeps_the_message() -> None:
    err = ADAPTER.map_error(400, {}, _err("invalid request: prompt must be at least 1 token long."), "co")
    assert isinstance(err, UpstreamStatusError)
    assert (err.status, err.type, err.upstream_status) == (400, "invalid_request_error", 400)
    assert err.message == "co error (400): invalid request: prompt must be at least 1 token long."
    assert err.code is None and err.provider == "co"
    assert (err.retryable, err.quota, err.context_window) == (False, False, False)


@pytest.mark.parametrize(
    "message",
    [
        "too many tokens: total number of tokens in the prompt cannot exceed 4081 - received 4292. Try using a "
        "shorter prompt, or enabling prompt truncating. See https://docs.cohere.com/reference/generate for more "
        "details.",
        "too many tokens: size limit exceeded by 11326 tokens. Try using shorter or fewer inputs, or setting "
        "prompt_truncation='AUTO'.",
    ],
)
def test_prompt_too_large_is_a_context_window_error(message: str) -> None:
    assert ADAPTER.map_error(400, {}, _err(message), "co").context_window is True


def test_max_tokens_above_the_model_limit_is_not_a_context_window_error() -> None:
    message = "too many tokens: max tokens must be less than or equal to 4096, the maximum output for this model"
    assert ADAPTER.map_error(400, {}, _err(message), "co").context_window is False


def test_rate_limit_is_retried_after_retry_after() -> None:
    body = _err("You are past the per minute request limit, please wait and try again later.")
    err = ADAPTER.map_error(429, {"retry-after": "30"}, body, "co")
    assert (err.status, err.type, err.retry_after) == (429, "rate_limit_error", 30.0)
    assert err.retryable is True and err.quota is False


def test_monthly_limit_and_payment_required_are_quotas() -> None:
    # The monthly trial limit's exact wording is not documented: any 429 that speaks of a month.
    monthly = ADAPTER.map_error(429, {}, _err("You are using a Trial key, limited to 1000 API calls / month."), "co")
    assert (monthly.quota, monthly.retryable) == (True, False)
    payment = ADAPTER.map_error(402, {}, _err("Please add or update your payment method."), "co")
    assert (payment.status, payment.quota, payment.retryable) == (502, True, False)


def test_server_errors_are_retried_and_non_json_bodies_kept() -> None:
    err = ADAPTER.map_error(503, {}, b"<html>Service Unavailable</html>", "co")
    assert err.message == "co error (503): <html>Service Unavailable</html>"
    assert (err.status, err.retryable) == (502, True)
    assert ADAPTER.map_error(500, {}, b"", "co").message == "co error (500): no error body"
