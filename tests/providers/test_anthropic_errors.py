"""Anthropic Messages: errors normalized from the real recordings in tests/fixtures/anthropic (pydantic-ai
cassettes, see SOURCES.md)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from providers.anthropic import reset_hint
from providers.base import map_params
from tests.helpers.adapters import request
from tests.helpers.recordings import fixture_bytes, fixture_json
from tests.providers.anthropic_setup import ADAPTER
from wire.errors import MAX_RETRY_AFTER_S, UnsupportedParamError, UpstreamStatusError

ERROR = "anthropic/error_400_invalid_request.json"


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
