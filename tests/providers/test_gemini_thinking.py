"""`reasoning_effort` on Gemini (providers/gemini_thinking.py): Google's OpenAI-compatibility mapping to
`generationConfig.thinkingConfig`, a level on Gemini 3 and a budget on 2.5, for completions and chat; values
with no documented mapping, and a level or budget the client's extras already set, are 400s naming it."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from gateway.path.chat_request import normalize_chat
from providers.base import Endpoint, map_params
from tests.helpers.adapters import build, request
from tests.providers.gemini_setup import ADAPTER
from wire.chat import decode_chat
from wire.errors import InvalidRequestError, UnsupportedParamError

BASE_URL = "https://generativelanguage.googleapis.com"
MESSAGES = [{"role": "user", "content": "hi"}]


def _endpoint(model: str) -> Endpoint:
    return Endpoint(provider="gem", model=model, base_url=BASE_URL, api_key="k")


def _completion(model: str, **fields: Any) -> dict[str, Any]:
    _, body, dropped = build(ADAPTER, request(f"gem/{model}", **fields), _endpoint(model))
    assert dropped == []
    return body


def _chat(model: str, **fields: Any) -> dict[str, Any]:
    req = decode_chat(msgspec.json.encode({"model": f"gem/{model}", "messages": MESSAGES, **fields}))
    normalize_chat(req)
    assert ADAPTER.chat_params is not None
    params, _ = map_params(req, ADAPTER.chat_params, "gem", False)
    body: dict[str, Any] = json.loads(ADAPTER.build_chat_request(req, _endpoint(model), params).body)
    return body


SENT = [
    # Gemini 2.5: thinkingBudget; none turns thinking off where the model can.
    ("gemini-2.5-flash", "none", {"thinkingBudget": 0}),
    ("gemini-2.5-flash", "minimal", {"thinkingBudget": 1024}),
    ("gemini-2.5-flash-lite", "low", {"thinkingBudget": 1024}),
    ("gemini-2.5-pro", "medium", {"thinkingBudget": 8192}),
    ("models/gemini-2.5-pro", "high", {"thinkingBudget": 24576}),
    # Gemini 3: thinkingLevel; the Pro models' column folds to the two levels they take.
    ("gemini-3-flash-preview", "minimal", {"thinkingLevel": "minimal"}),
    ("gemini-3-flash-preview", "medium", {"thinkingLevel": "medium"}),
    ("gemini-3-pro-preview", "minimal", {"thinkingLevel": "low"}),
    ("gemini-3-pro-preview", "medium", {"thinkingLevel": "high"}),
    ("gemini-3-pro-preview", "high", {"thinkingLevel": "high"}),
]


@pytest.mark.parametrize(("model", "effort", "config"), SENT)
def test_completions_carry_the_documented_thinking_config(model: str, effort: str, config: dict[str, Any]) -> None:
    body = _completion(model, reasoning_effort=effort, max_tokens=32)
    assert body["generationConfig"] == {"maxOutputTokens": 32, "thinkingConfig": config}


@pytest.mark.parametrize(("model", "effort", "config"), SENT)
def test_chat_carries_the_documented_thinking_config(model: str, effort: str, config: dict[str, Any]) -> None:
    body = _chat(model, reasoning_effort=effort)
    assert body["generationConfig"] == {"thinkingConfig": config}
    assert body["contents"] == [{"role": "user", "parts": [{"text": "hi"}]}]


def test_never_a_level_and_a_budget_together() -> None:
    for model, effort, _ in SENT:
        config = _chat(model, reasoning_effort=effort)["generationConfig"]["thinkingConfig"]
        assert len(config.keys() & {"thinkingLevel", "thinkingBudget"}) == 1


UNMAPPED = [
    ("gemini-2.5-flash", "xhigh", "Gemini 2.5 takes none, minimal, low, medium or high"),
    ("gemini-2.5-flash", "max", "Gemini 2.5 takes none, minimal, low, medium or high"),
    ("gemini-2.5-pro", "none", "Gemini 2.5 Pro cannot turn thinking off"),
    ("gemini-3-flash-preview", "none", "Gemini 3 models cannot turn thinking off"),
    ("gemini-3-pro-preview", "xhigh", "Gemini 3 takes minimal, low, medium or high"),
]


@pytest.mark.parametrize(("model", "effort", "why"), UNMAPPED)
def test_a_value_with_no_documented_mapping_is_refused_by_name(model: str, effort: str, why: str) -> None:
    for send in (_completion, _chat):
        with pytest.raises(UnsupportedParamError) as caught:
            send(model, reasoning_effort=effort)
        assert caught.value.param == "reasoning_effort"
        assert caught.value.code == "unsupported_parameter"
        assert caught.value.message == (
            f"Provider 'gem' cannot take reasoning_effort '{effort}' for model '{model}': {why} "
            "(Google's mapping: ai.google.dev/gemini-api/docs/openai#thinking)"
        )


def test_the_extras_thinking_config_is_merged_not_replaced() -> None:
    # `inference_extra_params` merges one level into generationConfig, so it would replace the whole
    # thinkingConfig: the effort is written after it, into what the client put there.
    extra = {"generationConfig": {"thinkingConfig": {"includeThoughts": True}, "temperature": 0.2}}
    body = _chat("gemini-2.5-flash", reasoning_effort="low", inference_extra_params=extra)
    assert body["generationConfig"] == {
        "temperature": 0.2,
        "thinkingConfig": {"includeThoughts": True, "thinkingBudget": 1024},
    }
    snake = {"generationConfig": {"thinking_config": {"include_thoughts": True}}}
    body = _completion("gemini-3-flash-preview", reasoning_effort="high", inference_extra_params=snake)
    assert body["generationConfig"] == {"thinking_config": {"include_thoughts": True, "thinkingLevel": "high"}}


@pytest.mark.parametrize("setting", [{"thinkingBudget": 512}, {"thinking_level": "low"}])
def test_a_level_or_budget_already_in_the_extras_conflicts(setting: dict[str, Any]) -> None:
    extra = {"generationConfig": {"thinkingConfig": setting}}
    with pytest.raises(InvalidRequestError) as caught:
        _chat("gemini-3-flash-preview", reasoning_effort="low", inference_extra_params=extra)
    assert caught.value.param == "reasoning_effort"
    assert caught.value.code == "invalid_value"
    # Without reasoning_effort the extras pass as they are, as before.
    assert (
        _chat("gemini-3-flash-preview", inference_extra_params=extra)["generationConfig"] == extra["generationConfig"]
    )


def test_without_reasoning_effort_no_thinking_config_is_sent() -> None:
    assert "generationConfig" not in _completion("gemini-2.5-pro")
    assert "generationConfig" not in _chat("gemini-3-pro-preview")
