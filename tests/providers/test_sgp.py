"""Scale GenAI Platform `/v4/beta/completions` (seed 003) as an upstream: `x-api-key`, string prompt,
boolean `logprobs` + `top_logprobs`, guided_* and the chat-oriented fields native."""

from __future__ import annotations

from typing import Any

import pytest

from providers.base import Endpoint
from providers.sgp import SGPAdapter
from tests.helpers.adapters import build, request
from wire.errors import UnsupportedParamError

ADAPTER = SGPAdapter()
ENDPOINT = Endpoint(provider="sgp", model="openai/gpt-4o-mini", base_url="https://api.egp.scale.com/", api_key="sgp-k")
BASE = {"model": "openai/gpt-4o-mini", "prompt": "Say this is a test"}


def test_url_and_x_api_key() -> None:
    req = request(inference_extra_headers={"x-selected-account-id": "acct-1"})
    up, body, _ = build(ADAPTER, req, ENDPOINT)
    assert up.url == "https://api.egp.scale.com/v4/beta/completions"
    assert up.headers == {
        "content-type": "application/json",
        "accept": "application/json",
        "x-selected-account-id": "acct-1",
        "x-api-key": "sgp-k",
    }
    assert body == BASE


@pytest.mark.parametrize(
    "fields,expected",
    [
        ({"logprobs": True, "top_logprobs": 3}, {"logprobs": True, "top_logprobs": 3}),
        ({"logprobs": True}, {"logprobs": True}),
        ({"return_token_log_probs": True}, {"logprobs": True}),
        ({"logprobs": 2}, {"logprobs": True, "top_logprobs": 2}),
        ({"logprobs": True, "top_logprobs": 20}, {"logprobs": True, "top_logprobs": 20}),
        ({"logprobs": False}, {}),
    ],
)
def test_logprobs_become_boolean_plus_count(fields: dict[str, Any], expected: dict[str, Any]) -> None:
    _, body, _ = build(ADAPTER, request(**fields), ENDPOINT)
    assert body == {**BASE, **expected}


@pytest.mark.parametrize(
    "field,value",
    [
        ("guided_json", {"type": "object"}),
        ("guided_regex", "a|b"),
        ("guided_choice", ["a", "b"]),
        ("guided_grammar", "root ::= 'a'"),
    ],
)
def test_guided_fields_native(field: str, value: Any) -> None:
    _, body, _ = build(ADAPTER, request(**{field: value}), ENDPOINT)
    assert body == {**BASE, field: value}


def test_llm_engine_names_and_chat_fields() -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    req = request(
        max_new_tokens=30,
        stop_sequences=["\n"],
        top_k=-1,
        include_stop_str_in_output=True,
        best_of=2,
        n=1,
        suffix="end",
        response_format={"type": "json_object"},
        tools=tools,
        tool_choice="auto",
        parallel_tool_calls=False,
        modalities=["text"],
        audio={"voice": "alloy"},
        prediction={"type": "content", "content": "x"},
        user="u",
    )
    _, body, _ = build(ADAPTER, req, ENDPOINT)
    assert body == {
        **BASE,
        "max_tokens": 30,
        "top_k": -1,
        "n": 1,
        "best_of": 2,
        "stop": ["\n"],
        "include_stop_str_in_output": True,
        "suffix": "end",
        "response_format": {"type": "json_object"},
        "user": "u",
        "audio": {"voice": "alloy"},
        "modalities": ["text"],
        "tools": tools,
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "prediction": {"type": "content", "content": "x"},
    }


def test_stream_and_extra_params() -> None:
    req = request(stream=True, inference_extra_params={"chat_template_kwargs": {"x": 1}})
    up, body, _ = build(ADAPTER, req, ENDPOINT)
    assert up.stream is True
    assert body == {**BASE, "stream": True, "stream_options": {"include_usage": True}, "chat_template_kwargs": {"x": 1}}


def test_list_prompt_refused() -> None:
    with pytest.raises(UnsupportedParamError) as info:
        ADAPTER.check(request(prompt=["a", "b"]), "sgp")
    assert info.value.param == "prompt"


def test_images_refused() -> None:
    with pytest.raises(UnsupportedParamError) as info:
        build(ADAPTER, request(images=["data:image/png;base64,AA=="]), ENDPOINT)
    assert info.value.param == "images"
