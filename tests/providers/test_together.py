"""Together `/v1/completions`: OpenAI's fields minus best_of/suffix/seed/user plus top_k; no stream_options.
Responses from the real Mixtral recording (`object: "text.completion"`, extra `prompt: []`)."""

from __future__ import annotations

from typing import Any

import pytest

from providers.base import Endpoint, map_params
from providers.retry_after import retry_after
from providers.together import TogetherAdapter
from tests.helpers.adapters import as_json, build, context, request
from tests.helpers.recordings import fixture_bytes, fixture_headers, fixture_json
from wire.errors import InvalidRequestError, UnsupportedParamError

ADAPTER = TogetherAdapter()
MODEL = "mistralai/Mixtral-8x7B-Instruct-v0.1"
ENDPOINT = Endpoint(provider="together", model=MODEL, base_url=TogetherAdapter.default_base_url or "", api_key="tg")


def test_request_translation() -> None:
    req = request(
        f"together/{MODEL}",
        "Tell me a joke about opentelemetry",
        max_tokens=512,
        temperature=0.7,
        top_p=0.7,
        top_k=50,
        n=1,
        stop=["</s>"],
        logprobs=1,
        echo=True,
        logit_bias={"2": 1.5},
        frequency_penalty=0.1,
        presence_penalty=0.2,
    )
    up, body, _ = build(ADAPTER, req, ENDPOINT)
    assert up.url == "https://api.together.xyz/v1/completions"
    assert up.headers == {
        "content-type": "application/json",
        "accept": "application/json",
        "authorization": "Bearer tg",
    }
    assert body == {
        "model": MODEL,
        "prompt": "Tell me a joke about opentelemetry",
        "max_tokens": 512,
        "temperature": 0.7,
        "top_p": 0.7,
        "top_k": 50,
        "n": 1,
        "stop": ["</s>"],
        "logprobs": 1,
        "echo": True,
        "logit_bias": {"2": 1.5},
        "frequency_penalty": 0.1,
        "presence_penalty": 0.2,
    }


@pytest.mark.parametrize("field,value", [("seed", 7), ("best_of", 2), ("suffix", "x"), ("user", "u")])
def test_refused_fields(field: str, value: Any) -> None:
    with pytest.raises(UnsupportedParamError) as info:
        build(ADAPTER, request(**{field: value}), ENDPOINT)
    assert info.value.param == field
    assert info.value.message == f"Parameter '{field}' is not supported by provider 'together'"


def test_drop_policy() -> None:
    _, dropped = map_params(request(seed=1, best_of=2, suffix="s", user="u"), ADAPTER.params, "together", True)
    assert dropped == ["best_of", "suffix", "seed", "user"]


def test_stream_has_no_stream_options() -> None:
    up, body, _ = build(ADAPTER, request(stream=True, stream_options={"include_usage": True}), ENDPOINT)
    assert up.stream is True
    assert body == {"model": MODEL, "prompt": "Say this is a test", "stream": True}


def test_recording_normalizes_to_our_completion() -> None:
    recorded = fixture_json("together/completion_mixtral_length.json")
    out = ADAPTER.parse_response(fixture_bytes("together/completion_mixtral_length.json"), context())
    assert as_json(out) == {
        "object": "text_completion",
        "id": "cmpl-gateway-test-id",
        "created": 1717697868,
        "model": "client/model-string",
        "choices": [
            {"text": recorded["choices"][0]["text"], "index": 0, "logprobs": None, "finish_reason": "length"},
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 512, "total_tokens": 522},
    }
    assert out.choices[0].text.startswith(" User: Why did the OpenTelemetry developer go broke?")
    assert out.choices[0].text.endswith("ctx := context.Background()")
    assert len(out.choices[0].text) == 1566


def test_recorded_rate_limit_headers_carry_no_retry_hint() -> None:
    # x-ratelimit-reset: 1 with remaining 0 is a bucket reset time, not a retry-after the code reads.
    headers = fixture_headers("together/completion_mixtral_length.headers.json")
    assert headers["x-ratelimit-remaining"] == "0"
    assert retry_after(headers) is None
    err = ADAPTER.map_error(429, headers, b'{"error": {"message": "rate limited"}}', "together")
    assert err.status == 429 and err.retry_after is None


def test_up_to_twenty_logprobs() -> None:
    # Together's OpenAPI spec: `logprobs` is an integer from 0 to 20.
    TogetherAdapter().check(request(prompt="x", logprobs=20), "together")
    with pytest.raises(InvalidRequestError) as caught:
        TogetherAdapter().check(request(prompt="x", logprobs=21), "together")
    assert caught.value.param == "logprobs"
