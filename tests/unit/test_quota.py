"""Reading an upstream's remaining quota from its answers' headers (providers/quota.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from providers.anthropic import AnthropicAdapter
from providers.gemini import GeminiAdapter
from providers.mistral import MistralAdapter
from providers.openai import OpenAIAdapter
from providers.quota import duration_s, exhausted_for

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def recorded(name: str) -> dict[str, str]:
    raw: dict[str, list[str]] = json.loads((FIXTURES / name).read_text())
    return {k.lower(): v[0] for k, v in raw.items()}


@pytest.mark.parametrize(
    "name",
    [
        "openai/completion_davinci002.headers.json",
        "mistral/chat_with_ratelimit_headers.headers.json",
        "fireworks/chat_stream_via_hf_router.headers.json",
    ],
)
def test_recorded_answers_with_quota_left_say_nothing(name: str) -> None:
    assert exhausted_for(recorded(name)) is None


def test_openai_counter_at_zero_waits_for_its_reset() -> None:
    # The recorded OpenAI headers with the requests counter used up: wait for its reset ("20ms").
    headers = recorded("openai/completion_davinci002.headers.json") | {"x-ratelimit-remaining-requests": "0"}
    assert exhausted_for(headers) == pytest.approx(0.02)
    headers |= {"x-ratelimit-remaining-tokens": "0", "x-ratelimit-reset-tokens": "6m0s"}
    assert exhausted_for(headers) == 360.0  # the later of the two resets


def test_mistral_window_is_in_the_header_name() -> None:
    headers = recorded("mistral/chat_with_ratelimit_headers.headers.json")
    assert exhausted_for(headers | {"x-ratelimit-remaining-req-10-second": "0"}) == 10.0
    assert exhausted_for(headers | {"x-ratelimit-remaining-tokens-month": "0"}) == 30 * 86400.0


def test_anthropic_resets_are_timestamps() -> None:
    headers = {
        "anthropic-ratelimit-requests-remaining": "0",
        "anthropic-ratelimit-requests-reset": "2026-11-22T00:00:30Z",
        "anthropic-ratelimit-tokens-remaining": "1000",
        "anthropic-ratelimit-tokens-reset": "2026-11-22T00:05:00Z",
    }
    now = 1795305600.0  # 2026-11-22T00:00:00Z
    assert exhausted_for(headers, now) == 30.0


def test_the_recorded_together_answer_used_up_its_quota() -> None:
    # A real answer: limit 2, remaining 0, reset 1 (second). The next request would be refused.
    assert exhausted_for(recorded("together/completion_mixtral_length.headers.json")) == 1.0


def test_together_single_counter() -> None:
    assert exhausted_for({"x-ratelimit-remaining": "0", "x-ratelimit-reset": "2"}) == 2.0
    # Exhausted without a usable reset: a short wait rather than none.
    assert exhausted_for({"x-ratelimit-remaining": "0", "x-ratelimit-reset": "soon"}) == 1.0


@pytest.mark.parametrize(
    ("value", "seconds"), [("20ms", 0.02), ("1s", 1.0), ("1.5s", 1.5), ("6m0s", 360.0), ("1h2m3s", 3723.0), ("7", 7.0)]
)
def test_durations(value: str, seconds: float) -> None:
    assert duration_s(value) == pytest.approx(seconds)


@pytest.mark.parametrize("value", ["", "soon", "5x", "m5"])
def test_unreadable_durations(value: str) -> None:
    assert duration_s(value) is None


def test_each_adapter_reads_the_quota_headers_it_declares() -> None:
    openai_used_up = {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "20s"}
    anthropic_used_up = {"anthropic-ratelimit-requests-remaining": "0", "anthropic-ratelimit-requests-reset": "soon"}
    assert OpenAIAdapter().exhausted_for(openai_used_up) == 20.0
    assert OpenAIAdapter().exhausted_for({"x-ratelimit-remaining": "0", "x-ratelimit-reset": "2"}) == 2.0
    assert AnthropicAdapter().exhausted_for(anthropic_used_up) == 1.0  # exhausted, reset unreadable: a short wait
    assert MistralAdapter().exhausted_for({"x-ratelimit-remaining-tokens-minute": "0"}) == 60.0
    # Another vendor's format is not read: its headers mean nothing coming from this provider.
    assert AnthropicAdapter().exhausted_for(openai_used_up) is None
    assert GeminiAdapter().exhausted_for(openai_used_up | anthropic_used_up) is None
