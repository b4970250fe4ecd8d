"""VMware PAIS (seed 004): only temperature, n, stop (array), max_tokens, seed; a single string prompt."""

from __future__ import annotations

from typing import Any

import pytest

from providers.base import Endpoint, map_params
from providers.pais import PAISAdapter
from tests.helpers.adapters import build, request
from wire.errors import UnsupportedParamError

ADAPTER = PAISAdapter()
BASE_URL = "https://pais.example.com/api/v1/compatibility/openai/v1"
ENDPOINT = Endpoint(provider="pais", model="llama-3-8b", base_url=BASE_URL, api_key="jwt-token")


def test_table_is_exactly_the_seed_fields() -> None:
    assert set(ADAPTER.params) == {"temperature", "n", "stop", "max_tokens", "seed"}


def test_request_translation_stop_as_list() -> None:
    req = request("pais/llama-3-8b", "hello", temperature=0.0, n=2, stop="\n", max_tokens=10, seed=5)
    up, body, _ = build(ADAPTER, req, ENDPOINT)
    assert up.url == BASE_URL + "/completions"
    assert up.headers == {
        "content-type": "application/json",
        "accept": "application/json",
        "authorization": "Bearer jwt-token",
    }
    assert body == {
        "model": "llama-3-8b",
        "prompt": "hello",
        "temperature": 0.0,
        "n": 2,
        "stop": ["\n"],
        "max_tokens": 10,
        "seed": 5,
    }


def test_stream_request() -> None:
    up, body, _ = build(ADAPTER, request(stream=True, stream_options={"include_usage": True}), ENDPOINT)
    assert up.stream is True
    assert body == {
        "model": "llama-3-8b",
        "prompt": "Say this is a test",
        "stream": True,
        "stream_options": {"include_usage": True},
    }


@pytest.mark.parametrize("prompt", [["a", "b"], [1, 2], [[1], [2]]])
def test_list_prompts_are_refused(prompt: Any) -> None:
    with pytest.raises(UnsupportedParamError) as info:
        ADAPTER.check(request(prompt=prompt), "pais")
    assert info.value.param == "prompt"
    assert info.value.message == "Provider 'pais' accepts only a single string prompt"


@pytest.mark.parametrize(
    "field,value",
    [("top_p", 0.5), ("logprobs", 1), ("echo", True), ("best_of", 1), ("user", "u"), ("frequency_penalty", 0.1)],
)
def test_everything_else_is_refused(field: str, value: Any) -> None:
    with pytest.raises(UnsupportedParamError) as info:
        build(ADAPTER, request(**{field: value}), ENDPOINT)
    assert info.value.param == field


def test_drop_policy() -> None:
    req = request(top_p=0.5, logprobs=1, user="u", max_tokens=1)
    params, dropped = map_params(req, ADAPTER.params, "pais", drop_unsupported=True)
    assert dropped == ["top_p", "logprobs", "user"]
    assert params == {"max_tokens": 1}


def test_keyless_endpoint_sends_no_authorization() -> None:
    up, _, _ = build(ADAPTER, request(), Endpoint(provider="pais", model="m", base_url=BASE_URL))
    assert "authorization" not in up.headers
    assert PAISAdapter.needs_api_key is False
