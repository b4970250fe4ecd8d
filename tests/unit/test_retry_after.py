"""retry_after(): `retry-after-ms`, then `retry-after` as seconds or an HTTP date; garbage is no hint."""

from __future__ import annotations

import email.utils

import pytest

from providers.openai import OpenAIAdapter
from providers.retry_after import retry_after
from tests.helpers.recordings import fixture_bytes, fixture_headers

NOW = 1_717_697_868.0


def test_milliseconds_win_over_seconds() -> None:
    assert retry_after({"retry-after-ms": "1500", "retry-after": "30"}) == 1.5


def test_seconds() -> None:
    assert retry_after({"retry-after": "20"}) == 20.0
    assert retry_after({"retry-after": "0.25"}) == 0.25


def test_http_date() -> None:
    date = email.utils.formatdate(NOW + 42, usegmt=True)
    assert retry_after({"retry-after": date}, now=NOW) == 42.0


def test_date_in_the_past_is_zero() -> None:
    date = email.utils.formatdate(NOW - 100, usegmt=True)
    assert retry_after({"retry-after": date}, now=NOW) == 0.0


def test_negative_values_clamp_to_zero() -> None:
    assert retry_after({"retry-after": "-5"}) == 0.0
    assert retry_after({"retry-after-ms": "-5"}) == 0.0


@pytest.mark.parametrize("value", ["soon", "", "12 seconds", "Mon, 99 Foo 2024"])
def test_garbage_is_no_hint(value: str) -> None:
    assert retry_after({"retry-after": value}) is None


def test_garbage_ms_falls_back_to_seconds() -> None:
    assert retry_after({"retry-after-ms": "abc", "retry-after": "3"}) == 3.0


@pytest.mark.parametrize("value", ["inf", "nan", "1e400", "-inf"])
def test_non_finite_numbers_are_no_hint(value: str) -> None:
    # A non-finite delay would break the client-facing retry-after header (int(inf) raises).
    assert retry_after({"retry-after": value}) is None
    assert retry_after({"retry-after-ms": value}) is None
    assert retry_after({"retry-after-ms": value, "retry-after": "2"}) == 2.0


def test_no_headers() -> None:
    assert retry_after({}) is None


@pytest.mark.parametrize(
    "recording",
    [
        "openai/completion_davinci002.headers.json",
        "together/completion_mixtral_length.headers.json",
        "mistral/chat_with_ratelimit_headers.headers.json",
        "fireworks/chat_stream_via_hf_router.headers.json",
        "azure/chat_finish_reason_content_filter.headers.json",
    ],
)
def test_recorded_rate_limit_headers_are_not_retry_hints(recording: str) -> None:
    # x-ratelimit-reset-* are bucket windows ("20ms", "1"), not an instruction to wait.
    assert retry_after(fixture_headers(recording)) is None


def test_map_error_carries_the_hint() -> None:
    body = fixture_bytes("openai/error_400_model_not_found.json")
    headers = {**fixture_headers("openai/completion_davinci002.headers.json"), "retry-after-ms": "250"}
    err = OpenAIAdapter().map_error(429, headers, body, "openai")
    assert err.status == 429
    assert err.retry_after == 0.25
