"""OpenAI `/v1/completions`: the reference dialect. Requests pass through field by field; responses are
normalized from the real davinci-002 recordings (tests/fixtures/openai, see SOURCES.md)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.upstream.framing import SSEDecoder
from providers.base import Endpoint, map_params
from providers.openai import OpenAIAdapter
from tests.helpers.adapters import as_json, build, chunked, context, request
from tests.helpers.recordings import fixture_bytes, fixture_json
from wire.errors import UnsupportedParamError, UpstreamStatusError
from wire.schema import Completion

ADAPTER = OpenAIAdapter()
ENDPOINT = Endpoint(provider="openai", model="davinci-002", base_url="https://api.openai.com/v1", api_key="sk-test")
BASE_HEADERS = {"content-type": "application/json", "accept": "application/json"}


def test_every_table_field_passes_through_as_is() -> None:
    req = request(
        "openai/davinci-002",
        "Tell me a joke about opentelemetry",
        max_tokens=7,
        temperature=0.5,
        top_p=0.9,
        n=2,
        best_of=3,
        stop=["\n", "END"],
        logprobs=5,
        echo=True,
        suffix="</s>",
        seed=42,
        logit_bias={"50256": -100},
        frequency_penalty=0.25,
        presence_penalty=-0.5,
        user="user-1234",
    )
    up, body, dropped = build(ADAPTER, req, ENDPOINT)
    assert up.method == "POST"
    assert up.url == "https://api.openai.com/v1/completions"
    assert up.headers == {**BASE_HEADERS, "authorization": "Bearer sk-test"}
    assert up.stream is False
    assert dropped == []
    assert body == {
        "model": "davinci-002",
        "prompt": "Tell me a joke about opentelemetry",
        "max_tokens": 7,
        "temperature": 0.5,
        "top_p": 0.9,
        "n": 2,
        "best_of": 3,
        "stop": ["\n", "END"],
        "logprobs": 5,
        "echo": True,
        "suffix": "</s>",
        "seed": 42,
        "logit_bias": {"50256": -100.0},
        "frequency_penalty": 0.25,
        "presence_penalty": -0.5,
        "user": "user-1234",
    }


def test_table_is_exactly_openai_create_params() -> None:
    assert set(ADAPTER.params) == {
        "max_tokens",
        "temperature",
        "top_p",
        "n",
        "best_of",
        "stop",
        "logprobs",
        "echo",
        "suffix",
        "seed",
        "logit_bias",
        "frequency_penalty",
        "presence_penalty",
        "user",
    }


def test_alias_fields_arrive_under_canonical_names() -> None:
    # SGP-style names from a client are folded by normalize() before the table applies.
    req = request(max_new_tokens=12, stop_sequences=["###"], return_token_log_probs=True)
    _, body, _ = build(ADAPTER, req, ENDPOINT)
    assert body == {
        "model": "davinci-002",
        "prompt": "Say this is a test",
        "max_tokens": 12,
        "stop": ["###"],
        "logprobs": 0,
    }


def test_bare_string_stop_becomes_a_list() -> None:
    _, body, _ = build(ADAPTER, request(stop="\n"), ENDPOINT)
    assert body["stop"] == ["\n"]


@pytest.mark.parametrize(
    "prompt",
    ["one", ["one", "two"], [1, 2, 3], [[1, 2], [3]]],
    ids=["text", "texts", "tokens", "token_lists"],
)
def test_every_prompt_form_is_forwarded_verbatim(prompt: Any) -> None:
    _, body, _ = build(ADAPTER, request(prompt=prompt), ENDPOINT)
    assert body == {"model": "davinci-002", "prompt": prompt}


def test_stream_asks_for_usage_even_when_the_client_did_not() -> None:
    req = request(stream=True, stream_options={"include_usage": False})
    up, body, _ = build(ADAPTER, req, ENDPOINT)
    assert up.stream is True
    assert body == {
        "model": "davinci-002",
        "prompt": "Say this is a test",
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def test_extra_params_and_headers_are_merged_auth_last() -> None:
    endpoint = Endpoint(
        provider="openai",
        model="davinci-002",
        base_url="https://proxy.internal/v1/",
        api_key="sk-test",
        headers={"openai-organization": "org-1", "authorization": "Bearer from-config"},
    )
    req = request(
        max_tokens=3,
        temperature=0.1,
        inference_extra_params={"temperature": 0.5, "metadata": {"trace": "abc"}},
        inference_extra_headers={"x-trace-id": "t-1", "openai-organization": "org-2"},
    )
    up, body, _ = build(ADAPTER, req, endpoint)
    assert up.url == "https://proxy.internal/v1/completions"
    # The operator's pinned organization wins over the client's.
    assert up.headers == {
        **BASE_HEADERS,
        "openai-organization": "org-1",
        "x-trace-id": "t-1",
        "authorization": "Bearer sk-test",
    }
    # inference_extra_params win over mapped fields: they are the client's explicit escape hatch.
    assert body == {
        "model": "davinci-002",
        "prompt": "Say this is a test",
        "max_tokens": 3,
        "temperature": 0.5,
        "metadata": {"trace": "abc"},
    }


def test_no_key_no_authorization_header() -> None:
    endpoint = Endpoint(provider="openai", model="m", base_url="https://api.openai.com/v1")
    up, _, _ = build(ADAPTER, request(), endpoint)
    assert up.headers == BASE_HEADERS


@pytest.mark.parametrize("field,value", [("top_k", 5), ("include_stop_str_in_output", True), ("guided_regex", "a+")])
def test_fields_outside_the_table_are_refused_naming_param_and_provider(field: str, value: Any) -> None:
    req = request(**{field: value})
    with pytest.raises(UnsupportedParamError) as info:
        map_params(req, ADAPTER.params, "my-openai", drop_unsupported=False)
    assert info.value.param == field
    assert info.value.status == 400
    assert info.value.code == "unsupported_parameter"
    assert info.value.message == f"Parameter '{field}' is not supported by provider 'my-openai'"


def test_logprobs_above_five_are_refused_by_check() -> None:
    req = request(logprobs=True, top_logprobs=6)
    with pytest.raises(UnsupportedParamError) as info:
        ADAPTER.check(req, "openai")
    assert info.value.param == "logprobs"
    assert info.value.message == "Provider 'openai' returns at most 5 logprobs, got 6"


# --- responses (real recordings) -------------------------------------------------------------------


def test_non_stream_recording_normalizes_exactly() -> None:
    ctx = context(["Tell me a joke about opentelemetry"])
    out = ADAPTER.parse_response(fixture_bytes("openai/completion_davinci002.json"), ctx)
    assert as_json(out) == {
        "object": "text_completion",
        "id": "cmpl-gateway-test-id",
        "created": 1709033850,
        "model": "client/model-string",
        "choices": [
            {
                "text": "-go library\nS-dmssea 2020-08-13: How",
                "index": 0,
                "logprobs": None,
                "finish_reason": "length",
            }
        ],
        "usage": {"prompt_tokens": 8, "completion_tokens": 16, "total_tokens": 24},
    }


def _stream(chunk_size: int) -> list[Completion | None]:
    raw = fixture_bytes("openai/completion_stream_davinci002.sse.txt")
    ctx = context(["Tell me a joke about opentelemetry"])
    decoder = SSEDecoder()
    events = [e for part in chunked(raw, chunk_size) for e in decoder.feed(part)] + decoder.close()
    return [ADAPTER.parse_event(event, data, ctx) for event, data in events]


def _recorded_stream_texts() -> list[str]:
    raw = fixture_bytes("openai/completion_stream_davinci002.sse.txt").decode()
    payloads = [line[len("data: ") :] for line in raw.splitlines() if line.startswith("data: ")]
    return [json.loads(p)["choices"][0]["text"] for p in payloads if p != "[DONE]"]


@pytest.mark.parametrize("chunk_size", [1, 3, 7, 13, 64, 250, 4096])
def test_stream_recording_relays_text_and_finish(chunk_size: int) -> None:
    parsed = _stream(chunk_size)
    assert parsed[-1] is None  # data: [DONE]
    chunks = [c for c in parsed if c is not None]
    recorded = _recorded_stream_texts()
    assert len(chunks) == len(recorded) == 16
    assert [c.choices[0].text for c in chunks] == recorded
    text = "".join(c.choices[0].text for c in chunks)
    assert text == "-common.\n\nI'm a python microservice that reads a JSON configuration file in order"
    assert [c.choices[0].finish_reason for c in chunks] == [None] * 15 + ["length"]
    assert {c.id for c in chunks} == {"cmpl-gateway-test-id"}
    assert {c.model for c in chunks} == {"client/model-string"}
    assert {c.created for c in chunks} == {1709033852}
    assert all(c.usage is None and c.choices[0].index == 0 and c.choices[0].logprobs is None for c in chunks)


def test_error_recording_maps_status_message_code_param() -> None:
    body = fixture_bytes("openai/error_400_model_not_found.json")
    err = ADAPTER.map_error(400, {}, body, "openai")
    assert isinstance(err, UpstreamStatusError)
    assert err.status == 400
    assert err.upstream_status == 400
    assert err.type == "invalid_request_error"
    assert err.message == "openai error (400): The requested model 'gpt-5.2-proo' does not exist."
    assert err.code == "model_not_found"
    assert err.param == "model"
    assert err.provider == "openai"
    assert err.retry_after is None


@pytest.mark.parametrize(
    "upstream,status,kind",
    [
        (400, 400, "invalid_request_error"),
        (404, 404, "invalid_request_error"),
        (422, 422, "invalid_request_error"),
        (401, 502, "upstream_error"),
        (403, 502, "upstream_error"),
        (408, 504, "timeout_error"),
        (429, 429, "rate_limit_error"),
        (500, 502, "upstream_error"),
        (503, 502, "upstream_error"),
        (504, 504, "timeout_error"),
    ],
)
def test_error_status_mapping(upstream: int, status: int, kind: str) -> None:
    body = fixture_bytes("openai/error_400_model_not_found.json")
    err = ADAPTER.map_error(upstream, {"retry-after": "7"}, body, "openai")
    assert (err.status, err.type) == (status, kind)
    assert err.retry_after == 7.0


def test_error_with_a_non_json_body_keeps_the_text() -> None:
    err = ADAPTER.map_error(502, {}, b"<html>Bad Gateway</html>\n", "openai")
    assert err.message == "openai error (502): <html>Bad Gateway</html>"
    assert err.code is None and err.param is None
    assert ADAPTER.map_error(500, {}, b"", "openai").message == "openai error (500): no error body"


def test_error_event_inside_a_stream_raises() -> None:
    data = json.dumps(fixture_json("openai/error_400_model_not_found.json"), separators=(",", ":")).encode()
    with pytest.raises(UpstreamStatusError) as info:
        ADAPTER.parse_event(None, data, context())
    # Classified by its words (providers/envelope.py): model_not_found is a 404, shown as one.
    assert (info.value.status, info.value.type) == (404, "invalid_request_error")
    assert info.value.code == "model_not_found"
    assert info.value.message == "upstream error (404): The requested model 'gpt-5.2-proo' does not exist."
