"""Anthropic Messages: requests translated field by field."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from providers import REGISTRY
from providers.anthropic import DEFAULT_MAX_TOKENS, AnthropicAdapter
from providers.base import Endpoint
from tests.helpers.adapters import COMPLETION_FIELDS, NATIVE, OPENAI_ONLY, SAMPLE, build, request, sample
from tests.providers.anthropic_setup import ADAPTER
from wire.errors import InvalidRequestError, UnsupportedParamError

ENDPOINT = Endpoint(
    provider="claude", model="claude-sonnet-4-5-20250929", base_url="https://api.anthropic.com", api_key="sk-ant-test"
)
HEADERS = {
    "content-type": "application/json",
    "accept": "application/json",
    "anthropic-version": "2023-06-01",
    "x-api-key": "sk-ant-test",
}


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
    *OPENAI_ONLY,
    *NATIVE,
)


def test_registered_under_its_kind() -> None:
    assert REGISTRY["anthropic"] is AnthropicAdapter


def test_every_canonical_field_is_mapped_emulated_or_refused() -> None:
    native = {"max_tokens", "temperature", "top_p", "top_k", "stop", "user", "reasoning_effort"}
    assert set(ADAPTER.params) == native | set(EMULATED_FIELDS)
    assert all(ADAPTER.params[f].emulated for f in EMULATED_FIELDS)
    assert set(COMPLETION_FIELDS) == native | set(EMULATED_FIELDS) | set(REFUSED)


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
