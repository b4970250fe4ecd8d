"""Gemini `generateContent` / `streamGenerateContent?alt=sse`: request translation field by field."""

from __future__ import annotations

from typing import Any

import pytest

from providers.base import Endpoint, map_params
from providers.gemini import GeminiAdapter
from tests.helpers.adapters import COMPLETION_FIELDS, NATIVE, OPENAI_ONLY, build, request, sample
from tests.providers.gemini_setup import ADAPTER
from wire.errors import InvalidRequestError, UnsupportedParamError

MODEL = "gemini-1.5-flash"
KEY = "gm-test-key"
ENDPOINT = Endpoint(provider="gemini", model=MODEL, base_url=GeminiAdapter.default_base_url or "", api_key=KEY)


BASE = "https://generativelanguage.googleapis.com/v1beta/models/gemini-1.5-flash"

EMULATED_FIELDS = {"echo", "best_of", "include_stop_str_in_output", "guided_regex", "guided_grammar"}
REFUSED: dict[str, Any] = sample(
    "suffix",
    "logit_bias",
    "user",
    *OPENAI_ONLY,
    *NATIVE,
)


# -- request translation ---------------------------------------------------------------------------


def test_every_native_field() -> None:
    req = request(
        f"gemini/{MODEL}",
        "What is the capital of France?",
        max_tokens=64,
        temperature=0.4,
        top_p=0.9,
        top_k=40,
        stop=["Paris", "Lyon"],
        n=2,
        presence_penalty=0.5,
        frequency_penalty=-0.5,
        seed=7,
        logprobs=3,
    )
    up, body, dropped = build(ADAPTER, req, ENDPOINT)
    assert up.method == "POST"
    assert up.url == f"{BASE}:generateContent"
    assert up.stream is False
    assert up.headers == {"content-type": "application/json", "accept": "application/json", "x-goog-api-key": KEY}
    assert KEY not in up.url
    assert dropped == []
    assert body == {
        "contents": [{"role": "user", "parts": [{"text": "What is the capital of France?"}]}],
        "generationConfig": {
            "maxOutputTokens": 64,
            "temperature": 0.4,
            "topP": 0.9,
            "topK": 40,
            "candidateCount": 2,
            "stopSequences": ["Paris", "Lyon"],
            "responseLogprobs": True,
            "logprobs": 3,
            "seed": 7,
            "frequencyPenalty": -0.5,
            "presencePenalty": 0.5,
        },
    }


def test_stream_uses_the_sse_endpoint() -> None:
    up, body, _ = build(ADAPTER, request(stream=True, stream_options={"include_usage": True}), ENDPOINT)
    assert up.url == f"{BASE}:streamGenerateContent?alt=sse"
    assert up.stream is True
    assert up.headers["accept"] == "text/event-stream"
    # No stream flag in the body: the method name selects streaming; every event carries usage anyway.
    assert body == {"contents": [{"role": "user", "parts": [{"text": "Say this is a test"}]}]}


def test_api_version_model_resource_name_and_base_url() -> None:
    endpoint = Endpoint(
        provider="gemini", model="models/gemini-2.0-flash", base_url="http://127.0.0.1:9/gem/", api_version="v1"
    )
    up, _, _ = build(ADAPTER, request(), endpoint)
    assert up.url == "http://127.0.0.1:9/gem/v1/models/gemini-2.0-flash:generateContent"
    assert "x-goog-api-key" not in up.headers


def test_headers_from_config_and_request() -> None:
    endpoint = Endpoint(
        provider="gemini", model=MODEL, base_url=ENDPOINT.base_url, api_key=KEY, headers={"X-Goog-User-Project": "p1"}
    )
    req = request(inference_extra_headers={"X-Trace": "t-1", "Accept": "application/json"})
    up, _, _ = build(ADAPTER, req, endpoint)
    assert up.headers == {
        "content-type": "application/json",
        "accept": "application/json",
        "x-goog-user-project": "p1",
        "x-trace": "t-1",
        "x-goog-api-key": KEY,
    }


def test_extra_params_extend_generation_config() -> None:
    req = request(
        max_tokens=5,
        inference_extra_params={
            "generationConfig": {"thinkingConfig": {"thinkingBudget": 0}},
            "safetySettings": [{"category": "HARM_CATEGORY_HARASSMENT", "threshold": "BLOCK_NONE"}],
        },
    )
    _, body, _ = build(ADAPTER, req, ENDPOINT)
    assert body["generationConfig"] == {"maxOutputTokens": 5, "thinkingConfig": {"thinkingBudget": 0}}
    assert body["safetySettings"] == [{"category": "HARM_CATEGORY_HARASSMENT", "threshold": "BLOCK_NONE"}]


@pytest.mark.parametrize("k", [-1, 0])
def test_top_k_without_a_cut_is_left_unset(k: int) -> None:
    _, body, _ = build(ADAPTER, request(top_k=k), ENDPOINT)
    assert "generationConfig" not in body


def test_logprobs_zero_asks_only_for_the_sampled_tokens() -> None:
    _, body, _ = build(ADAPTER, request(logprobs=0), ENDPOINT)
    assert body["generationConfig"] == {"responseLogprobs": True}


def test_boolean_logprobs_up_to_twenty_alternatives() -> None:
    _, body, _ = build(ADAPTER, request(logprobs=True, top_logprobs=20), ENDPOINT)
    assert body["generationConfig"] == {"responseLogprobs": True, "logprobs": 20}


def test_stop_sequences_cap_is_five() -> None:
    assert GeminiAdapter.max_stop == 5


SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


@pytest.mark.parametrize(
    "response_format,config",
    [
        ({"type": "json_object"}, {"responseMimeType": "application/json"}),
        (
            {"type": "json_object", "schema": SCHEMA},
            {"responseMimeType": "application/json", "responseJsonSchema": SCHEMA},
        ),
        (
            {"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA}},
            {"responseMimeType": "application/json", "responseJsonSchema": SCHEMA},
        ),
    ],
)
def test_response_format(response_format: dict[str, Any], config: dict[str, Any]) -> None:
    _, body, _ = build(ADAPTER, request(response_format=response_format), ENDPOINT)
    assert body["generationConfig"] == config


def test_response_format_text_is_the_default() -> None:
    _, body, _ = build(ADAPTER, request(response_format={"type": "text"}), ENDPOINT)
    assert "generationConfig" not in body


@pytest.mark.parametrize(
    "response_format", [{"type": "grammar", "grammar": "root ::= x"}, {"type": "json_schema", "json_schema": {}}]
)
def test_response_format_it_cannot_express_is_refused(response_format: dict[str, Any]) -> None:
    with pytest.raises(InvalidRequestError) as info:
        build(ADAPTER, request(response_format=response_format), ENDPOINT)
    assert info.value.param == "response_format"
    assert info.value.status == 400


def test_guided_json_goes_to_response_json_schema() -> None:
    # additionalProperties is JSON Schema that the proto-typed responseSchema would reject.
    schema = {**SCHEMA, "additionalProperties": False}
    _, body, _ = build(ADAPTER, request(guided_json=schema), ENDPOINT)
    assert body["generationConfig"] == {"responseMimeType": "application/json", "responseJsonSchema": schema}


def test_guided_choice_uses_enum_mode() -> None:
    _, body, _ = build(ADAPTER, request(guided_choice=["Positive", "Negative", "Neutral"]), ENDPOINT)
    assert body["generationConfig"] == {
        "responseMimeType": "text/x.enum",
        "responseSchema": {"type": "STRING", "enum": ["Positive", "Negative", "Neutral"]},
    }


def test_guided_choice_conflicts_with_json_mode() -> None:
    with pytest.raises(InvalidRequestError) as info:
        build(ADAPTER, request(response_format={"type": "json_object"}, guided_choice=["a", "b"]), ENDPOINT)
    assert info.value.param == "guided_choice"


@pytest.mark.parametrize(
    "field,value",
    [
        ("echo", True),
        ("best_of", 3),
        ("include_stop_str_in_output", True),
        ("guided_regex", "[0-9]+"),
        ("guided_grammar", "root ::= 'a'"),
    ],
)
def test_emulated_fields_write_nothing(field: str, value: Any) -> None:
    _, body, dropped = build(ADAPTER, request(**{field: value}), ENDPOINT)
    assert body == {"contents": [{"role": "user", "parts": [{"text": "Say this is a test"}]}]}
    assert dropped == []
    assert ADAPTER.params[field].emulated


@pytest.mark.parametrize("field,value", sorted(REFUSED.items()))
def test_refused_fields(field: str, value: Any) -> None:
    with pytest.raises(UnsupportedParamError) as info:
        build(ADAPTER, request(**{field: value}), ENDPOINT)
    assert info.value.param == field
    assert info.value.message == f"Parameter '{field}' is not supported by provider 'gemini'"


def test_drop_policy_lists_what_it_dropped() -> None:
    _, dropped = map_params(request(suffix="s", logit_bias={"1": 1.0}, user="u"), ADAPTER.params, "gemini", True)
    assert dropped == ["suffix", "logit_bias", "user"]


def test_every_canonical_field_is_mapped_emulated_or_refused() -> None:
    native = set(ADAPTER.params) - EMULATED_FIELDS
    assert EMULATED_FIELDS <= set(ADAPTER.params)
    assert native | EMULATED_FIELDS | set(REFUSED) == set(COMPLETION_FIELDS)
    assert not (set(ADAPTER.params) & set(REFUSED))


@pytest.mark.parametrize("prompt", [["a", "b"], [1, 2, 3], [[1], [2]]])
def test_only_one_text_prompt_per_call(prompt: Any) -> None:
    with pytest.raises(UnsupportedParamError) as info:
        ADAPTER.check(request(prompt=prompt), "gemini")
    assert info.value.param == "prompt"


def test_twenty_logprobs_are_accepted() -> None:
    # Gemini returns up to 20 alternatives per step; the boolean form is how a client asks for more than 5.
    assert GeminiAdapter.max_logprobs == 20
    ADAPTER.check(request(logprobs=True, top_logprobs=20), "gemini")
