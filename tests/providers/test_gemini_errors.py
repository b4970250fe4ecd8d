"""Gemini: upstream errors (blocked prompts, quota and rate-limit 429s, context-window 400s) mapped from real
bodies (tests/fixtures/gemini, see SOURCES.md)."""

from __future__ import annotations

import json

import msgspec
import pytest

from tests.helpers.adapters import context
from tests.providers.gemini_setup import ADAPTER, encode
from wire.errors import UpstreamStatusError

# Error bodies quoted from public reports (see each test).
RETRY_INFO_429 = {
    "error": {
        "code": 429,
        "message": "You exceeded your current quota... Please retry in 53.016342224s.",
        "status": "RESOURCE_EXHAUSTED",
        "details": [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "53s"}],
    }
}
PER_DAY_429 = {
    "error": {
        "code": 429,
        "message": "You exceeded your current quota, please check your plan and billing details. For more "
        "information on this error, head to: https://ai.google.dev/gemini-api/docs/rate-limits.",
        "status": "RESOURCE_EXHAUSTED",
        "details": [
            {
                "@type": "type.googleapis.com/google.rpc.QuotaFailure",
                "violations": [
                    {
                        "quotaMetric": "generativelanguage.googleapis.com/generate_content_free_tier_input_token_count",
                        "quotaId": "GenerateContentInputTokensPerModelPerMinute-FreeTier",
                        "quotaDimensions": {"location": "global", "model": "gemini-2.5-flash-preview-image"},
                    },
                    {
                        "quotaMetric": "generativelanguage.googleapis.com/generate_content_free_tier_requests",
                        "quotaId": "GenerateRequestsPerMinutePerProjectPerModel-FreeTier",
                        "quotaDimensions": {"location": "global", "model": "gemini-2.5-flash-preview-image"},
                    },
                    {
                        "quotaMetric": "generativelanguage.googleapis.com/generate_content_free_tier_requests",
                        "quotaId": "GenerateRequestsPerDayPerProjectPerModel-FreeTier",
                        "quotaDimensions": {"model": "gemini-2.5-flash-preview-image", "location": "global"},
                    },
                ],
            }
        ],
    }
}
PER_MINUTE_429 = {
    "error": {
        "code": 429,
        "message": "You exceeded your current quota, please check your plan and billing details. For more "
        "information on this error, head to: https://ai.google.dev/gemini-api/docs/rate-limits.",
        "status": "RESOURCE_EXHAUSTED",
        "details": [
            {
                "@type": "type.googleapis.com/google.rpc.QuotaFailure",
                "violations": [
                    {
                        "quotaMetric": "generativelanguage.googleapis.com/generate_requests_per_model",
                        "quotaId": "GenerateRequestsPerMinutePerProjectPerModel",
                        "quotaDimensions": {"model": "gemini-2.0-pro-exp", "location": "global"},
                    }
                ],
            },
            {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "44s"},
        ],
    }
}
CONTEXT_400 = {
    "error": {
        "code": 400,
        "message": "The input token count (132478) exceeds the maximum number of tokens allowed (131072).",
        "status": "INVALID_ARGUMENT",
    }
}


# -- errors ----------------------------------------------------------------------------------------


def test_retry_info_delay() -> None:
    # googleapis/python-genai#1875: the RetryInfo entry of a 429 (the message's "..." is the reporter's).
    err = ADAPTER.map_error(429, {}, encode(RETRY_INFO_429), "gemini")
    assert isinstance(err, UpstreamStatusError)
    assert err.status == 429
    assert err.retry_after == 53.0
    assert err.code == "RESOURCE_EXHAUSTED"
    assert err.retryable and not err.quota and not err.context_window
    assert err.message.startswith("gemini error (429): You exceeded your current quota")


def test_fractional_retry_delay() -> None:
    # dcdpr/jp#1061: retryDelay is a protobuf Duration with up to nine fractional digits.
    body = json.loads(json.dumps(RETRY_INFO_429))
    body["error"]["details"][0]["retryDelay"] = "45.837906927s"
    assert ADAPTER.map_error(429, {}, encode(body), "gemini").retry_after == 45.837906927


def test_retry_after_header_wins() -> None:
    assert ADAPTER.map_error(429, {"retry-after": "7"}, encode(RETRY_INFO_429), "gemini").retry_after == 7.0


def test_per_minute_quota_is_retryable() -> None:
    # Aider-AI/aider#3694 (QuotaFailure per minute + RetryInfo "44s"; the Help entry omitted).
    err = ADAPTER.map_error(429, {}, encode(PER_MINUTE_429), "gemini")
    assert err.retry_after == 44.0
    assert err.retryable and not err.quota


def test_per_day_quota_is_not_retried() -> None:
    # google-gemini/gemini-cli#8437: violations include GenerateRequestsPerDayPerProjectPerModel-FreeTier
    # (quoted up to the QuotaFailure entry; the Help entry that followed is omitted).
    err = ADAPTER.map_error(429, {}, encode(PER_DAY_429), "gemini")
    assert err.quota
    assert not err.retryable
    assert err.status == 429


def test_zero_limit_is_a_quota() -> None:
    # continuedev/continue#9570: no QuotaFailure, the message says "limit: 0" and "Please retry in ...s".
    message = (
        "You exceeded your current quota, please check your plan and billing details. "
        "* Quota exceeded for metric: generativelanguage.googleapis.com/generate_content_free_tier_requests, "
        "limit: 0, model: gemini-3-pro\nPlease retry in 45.578569677s."
    )
    body = {"error": {"code": 429, "message": message, "status": "RESOURCE_EXHAUSTED"}}
    err = ADAPTER.map_error(429, {}, encode(body), "gemini")
    assert err.quota and not err.retryable
    assert err.retry_after == 45.578569677


def test_prompt_too_long_is_a_context_window_error() -> None:
    # google-gemini/gemini-cli#4118 (AI Studio key): the whole 400 body.
    err = ADAPTER.map_error(400, {}, encode(CONTEXT_400), "gemini")
    assert err.context_window
    assert err.status == 400 and err.type == "invalid_request_error"
    assert err.code == "context_length_exceeded"  # one code for the meaning (providers/context.py)
    assert not err.retryable


def test_array_wrapped_envelope() -> None:
    # The non-SSE stream endpoint wraps errors in an array (gemini-cli#14811 shows `[{"error": ...}]`).
    err = ADAPTER.map_error(400, {}, encode([CONTEXT_400]), "gemini")
    assert err.context_window


@pytest.mark.parametrize("status", [500, 503])
def test_server_errors_are_retryable(status: int) -> None:
    body = {"error": {"code": status, "message": "The model is overloaded.", "status": "UNAVAILABLE"}}
    err = ADAPTER.map_error(status, {}, encode(body), "gemini")
    assert err.retryable and err.status == 502
    assert err.retry_after is None


def test_unparseable_error_body() -> None:
    err = ADAPTER.map_error(502, {}, b"<html>Bad Gateway</html>", "gemini")
    assert err.message == "gemini error (502): <html>Bad Gateway</html>"
    assert err.code is None


def test_error_event_mid_stream_raises() -> None:
    with pytest.raises(UpstreamStatusError) as info:
        ADAPTER.parse_event(None, encode(RETRY_INFO_429), context(["x"]))
    assert info.value.upstream_status == 429
    assert info.value.retry_after == 53.0


def test_invalid_json_event_is_a_decode_error() -> None:
    with pytest.raises(msgspec.DecodeError):
        ADAPTER.parse_event(None, b"{not json", context(["x"]))
