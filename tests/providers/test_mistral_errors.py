"""Mistral: error and rate-limit header mapping."""

from __future__ import annotations

import pytest

from providers.mistral import RateLimit, rate_limits
from tests.helpers.recordings import fixture_headers
from tests.providers.mistral_setup import ADAPTER, encode
from wire.errors import UpstreamStatusError

HEADERS = "mistral/chat_with_ratelimit_headers.headers.json"


# -- rate-limit headers and errors -----------------------------------------------------------------


def test_recorded_rate_limit_headers() -> None:
    limits = rate_limits(fixture_headers(HEADERS))
    assert limits == {
        "req-10-second": RateLimit(limit=60, remaining=59),
        "tokens-minute": RateLimit(limit=2_000_000, remaining=1_999_893),
        "tokens-month": RateLimit(limit=10_000_000_000, remaining=9_999_999_893),
    }


def exhausted(bucket: str) -> dict[str, str]:
    """The recorded headers with one bucket's remaining count at zero (as a 429 would report it)."""
    headers = fixture_headers(HEADERS)
    headers[f"x-ratelimit-remaining-{bucket}"] = "0"
    return headers


# cline/cline#9085: the 429 body of the current API.
RATE_LIMITED = {
    "object": "error",
    "message": "Rate limit exceeded",
    "type": "rate_limited",
    "param": None,
    "code": "1300",
}


def test_429_with_retry_after() -> None:
    err = ADAPTER.map_error(429, {**fixture_headers(HEADERS), "retry-after": "3"}, encode(RATE_LIMITED), "mistral")
    assert isinstance(err, UpstreamStatusError)
    assert err.status == 429 and err.type == "rate_limit_error"
    assert err.retry_after == 3.0
    assert err.code == "1300"
    assert err.retryable and not err.quota
    assert err.message == "mistral error (429): Rate limit exceeded"


def test_429_with_recorded_headers_and_nothing_exhausted_has_no_hint() -> None:
    err = ADAPTER.map_error(429, fixture_headers(HEADERS), encode(RATE_LIMITED), "mistral")
    assert err.retry_after is None and err.retryable


@pytest.mark.parametrize("bucket,window", [("req-10-second", 10.0), ("tokens-minute", 60.0)])
def test_exhausted_window_bounds_the_wait(bucket: str, window: float) -> None:
    err = ADAPTER.map_error(429, exhausted(bucket), encode(RATE_LIMITED), "mistral")
    assert err.retry_after == window
    assert err.retryable and not err.quota


def test_exhausted_monthly_budget_is_a_quota() -> None:
    err = ADAPTER.map_error(429, exhausted("tokens-month"), encode(RATE_LIMITED), "mistral")
    assert err.quota and not err.retryable
    assert err.status == 429


def test_older_error_body() -> None:
    # pydantic/pydantic-ai#1885: {"message": "Requests rate limit exceeded"}.
    err = ADAPTER.map_error(429, {}, b'{"message":"Requests rate limit exceeded"}', "mistral")
    assert err.message == "mistral error (429): Requests rate limit exceeded"
    assert err.code is None and err.retryable


def test_context_window_wording() -> None:
    # Wording not recorded for Mistral (see the adapter): the OpenAI/vLLM phrase.
    body = {
        "object": "error",
        "message": "This model's maximum context length is 32768 tokens. However, you requested 40000 tokens.",
        "type": "invalid_request_error",
        "param": None,
        "code": None,
    }
    err = ADAPTER.map_error(400, {}, encode(body), "mistral")
    assert err.context_window and not err.retryable
    assert err.code == "context_length_exceeded"


def test_structured_validation_message() -> None:
    body = {"object": "error", "message": {"detail": [{"loc": ["body", "top_p"], "msg": "bad"}]}, "type": "invalid"}
    err = ADAPTER.map_error(422, {}, encode(body), "mistral")
    assert err.status == 422
    assert err.message == 'mistral error (422): {"detail":[{"loc":["body","top_p"],"msg":"bad"}]}'


def test_auth_failure_is_the_gateways_problem() -> None:
    err = ADAPTER.map_error(401, {}, b'{"message":"Unauthorized","request_id":"r"}', "mistral")
    assert err.status == 502 and not err.retryable


def test_unparseable_error_body() -> None:
    err = ADAPTER.map_error(503, {}, b"upstream connect error", "mistral")
    assert err.message == "mistral error (503): upstream connect error"
    assert err.retryable
