"""Mistral chat (`/v1/chat/completions`) and FIM (`/v1/fim/completions`, when `suffix` is set): request
translation field by field."""

from __future__ import annotations

from typing import Any

import pytest

from providers.base import Endpoint, map_params
from providers.mistral import MistralAdapter
from tests.helpers.adapters import COMPLETION_FIELDS, NATIVE, OPENAI_ONLY, build, request, sample
from tests.providers.mistral_setup import ADAPTER, PROMPT
from wire.errors import InvalidRequestError, UnsupportedParamError

MODEL = "mistral-tiny"
KEY = "ms-test-key"
ENDPOINT = Endpoint(provider="mistral", model=MODEL, base_url=MistralAdapter.default_base_url or "", api_key=KEY)


EMULATED_FIELDS = {
    "echo",
    "best_of",
    "include_stop_str_in_output",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
}
REFUSED: dict[str, Any] = sample(
    "logprobs",
    "top_k",
    "logit_bias",
    "user",
    "reasoning_effort",
    *OPENAI_ONLY,
    *NATIVE,
)
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}


# -- chat request translation ----------------------------------------------------------------------


def test_every_native_chat_field() -> None:
    req = request(
        f"mistral/{MODEL}",
        PROMPT,
        max_tokens=96,
        temperature=0.3,
        top_p=0.95,
        stop=["\n\n"],
        seed=42,
        presence_penalty=0.1,
        frequency_penalty=0.2,
        n=2,
    )
    up, body, dropped = build(ADAPTER, req, ENDPOINT)
    assert up.method == "POST"
    assert up.url == "https://api.mistral.ai/v1/chat/completions"
    assert up.stream is False
    assert up.headers == {
        "content-type": "application/json",
        "accept": "application/json",
        "authorization": f"Bearer {KEY}",
    }
    assert dropped == []
    assert body == {
        "model": MODEL,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": 96,
        "temperature": 0.3,
        "top_p": 0.95,
        "n": 2,
        "stop": ["\n\n"],
        "random_seed": 42,
        "frequency_penalty": 0.2,
        "presence_penalty": 0.1,
    }


def test_stream_request() -> None:
    up, body, _ = build(ADAPTER, request(prompt=PROMPT, stream=True, stream_options={"include_usage": True}), ENDPOINT)
    assert up.stream is True
    assert up.headers["accept"] == "text/event-stream"
    # As the recorded request: no stream_options, usage comes on the finish chunk regardless.
    assert body == {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}], "stream": True}


def test_config_and_request_headers_and_extra_params() -> None:
    endpoint = Endpoint(
        provider="mistral", model=MODEL, base_url="http://127.0.0.1:9/m/", api_key=KEY, headers={"X-Org": "o1"}
    )
    req = request(inference_extra_headers={"X-Trace": "t"}, inference_extra_params={"safe_prompt": True})
    up, body, _ = build(ADAPTER, req, endpoint)
    assert up.url == "http://127.0.0.1:9/m/v1/chat/completions"
    assert up.headers == {
        "content-type": "application/json",
        "accept": "application/json",
        "x-org": "o1",
        "x-trace": "t",
        "authorization": f"Bearer {KEY}",
    }
    assert body["safe_prompt"] is True


@pytest.mark.parametrize(
    "response_format,sent",
    [
        ({"type": "json_object"}, {"type": "json_object"}),
        (
            {"type": "json_object", "schema": SCHEMA},
            {"type": "json_schema", "json_schema": {"name": "output", "schema": SCHEMA, "strict": True}},
        ),
        (
            {"type": "json_schema", "json_schema": {"name": "book", "schema": SCHEMA, "strict": True}},
            {"type": "json_schema", "json_schema": {"name": "book", "schema": SCHEMA, "strict": True}},
        ),
        ({"type": "text"}, {"type": "text"}),
    ],
)
def test_response_format(response_format: dict[str, Any], sent: dict[str, Any]) -> None:
    _, body, _ = build(ADAPTER, request(response_format=response_format), ENDPOINT)
    assert body["response_format"] == sent


def test_response_format_it_cannot_express_is_refused() -> None:
    with pytest.raises(InvalidRequestError) as info:
        build(ADAPTER, request(response_format={"type": "grammar", "grammar": "root ::= x"}), ENDPOINT)
    assert info.value.param == "response_format"


def test_guided_json_is_a_strict_json_schema() -> None:
    _, body, _ = build(ADAPTER, request(guided_json=SCHEMA), ENDPOINT)
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "output", "schema": SCHEMA, "strict": True},
    }


@pytest.mark.parametrize(
    "field,value",
    [
        ("echo", True),
        ("best_of", 2),
        ("include_stop_str_in_output", True),
        ("guided_regex", "[0-9]+"),
        ("guided_choice", ["yes", "no"]),
        ("guided_grammar", "root ::= 'a'"),
    ],
)
def test_emulated_fields_write_nothing(field: str, value: Any) -> None:
    _, body, dropped = build(ADAPTER, request(**{field: value}), ENDPOINT)
    assert body == {"model": MODEL, "messages": [{"role": "user", "content": "Say this is a test"}]}
    assert dropped == []
    assert ADAPTER.params[field].emulated


@pytest.mark.parametrize("field,value", sorted(REFUSED.items()))
def test_refused_fields(field: str, value: Any) -> None:
    with pytest.raises(UnsupportedParamError) as info:
        build(ADAPTER, request(**{field: value}), ENDPOINT)
    assert info.value.param == field
    assert info.value.message == f"Parameter '{field}' is not supported by provider 'mistral'"


def test_drop_policy_lists_what_it_dropped() -> None:
    _, dropped = map_params(request(top_k=5, logprobs=2, user="u"), ADAPTER.params, "mistral", True)
    assert dropped == ["top_k", "logprobs", "user"]


def test_every_canonical_field_is_mapped_emulated_or_refused() -> None:
    assert EMULATED_FIELDS <= set(ADAPTER.params)
    assert set(ADAPTER.params) | set(REFUSED) == set(COMPLETION_FIELDS)
    assert not (set(ADAPTER.params) & set(REFUSED))


@pytest.mark.parametrize("prompt", [["a", "b"], [1, 2, 3]])
def test_only_one_text_prompt_per_call(prompt: Any) -> None:
    with pytest.raises(UnsupportedParamError) as info:
        ADAPTER.check(request(prompt=prompt), "mistral")
    assert info.value.param == "prompt"


# -- FIM request translation -----------------------------------------------------------------------


def test_suffix_switches_to_fim() -> None:
    req = request(
        "mistral/codestral-latest",
        "def fib(n):\n",
        suffix="\nprint(fib(10))",
        max_tokens=64,
        temperature=0.0,
        top_p=1.0,
        stop=["\n\n"],
        seed=3,
        n=1,
        stream=True,
    )
    endpoint = Endpoint(provider="mistral", model="codestral-latest", base_url=ENDPOINT.base_url, api_key=KEY)
    up, body, _ = build(ADAPTER, req, endpoint)
    assert up.url == "https://api.mistral.ai/v1/fim/completions"
    assert up.headers["authorization"] == f"Bearer {KEY}"
    # n=1 is FIM's only behaviour, so it is not sent (FIMCompletionRequest has no `n`).
    assert body == {
        "model": "codestral-latest",
        "prompt": "def fib(n):\n",
        "suffix": "\nprint(fib(10))",
        "max_tokens": 64,
        "temperature": 0.0,
        "top_p": 1.0,
        "stop": ["\n\n"],
        "random_seed": 3,
        "stream": True,
    }


@pytest.mark.parametrize(
    "field,value",
    [
        ("n", 2),
        ("presence_penalty", 0.5),
        ("frequency_penalty", 0.5),
        ("response_format", {"type": "json_object"}),
        ("guided_json", SCHEMA),
    ],
)
def test_chat_only_fields_are_refused_with_suffix(field: str, value: Any) -> None:
    with pytest.raises(UnsupportedParamError) as info:
        build(ADAPTER, request(suffix="x", **{field: value}), ENDPOINT)
    assert info.value.param == field
    assert info.value.message == (
        f"Parameter '{field}' is not supported by provider 'mistral' together with 'suffix' (Mistral FIM completions)"
    )
