"""vLLM's OpenAI-compatible server: guided_* become `structured_outputs.*` (vLLM >= 0.12 silently ignores the
old names), Fireworks-style `response_format` schemas too; top_k, include_stop_str_in_output native;
logprobs up to 20. Response from the real opt-125m recording (extra `stop_reason` dropped)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from providers.base import CallContext, Endpoint
from providers.vllm import VLLMAdapter
from tests.helpers.adapters import as_json, build, context, request
from tests.helpers.recordings import fixture_bytes
from wire.errors import UnsupportedParamError, UpstreamStatusError

ADAPTER = VLLMAdapter()
MODEL = "meta-llama/Llama-3.1-8B"
ENDPOINT = Endpoint(provider="local", model=MODEL, base_url="http://127.0.0.1:8000/v1")
BASE = {"model": MODEL, "prompt": "Say this is a test"}
SCHEMA: dict[str, Any] = {"type": "object", "properties": {"a": {"type": "integer"}}}


@pytest.mark.parametrize(
    "field,value,target",
    [
        ("guided_json", SCHEMA, "json"),
        ("guided_regex", "[0-9]{3}", "regex"),
        ("guided_choice", ["yes", "no"], "choice"),
        ("guided_grammar", 'root ::= "a" | "b"', "grammar"),
    ],
)
def test_guided_fields_become_structured_outputs(field: str, value: Any, target: str) -> None:
    _, body, _ = build(ADAPTER, request(**{field: value}), ENDPOINT)
    assert body == {**BASE, "structured_outputs": {target: value}}


def test_fireworks_style_schema_becomes_structured_outputs_json() -> None:
    _, body, _ = build(ADAPTER, request(response_format={"type": "json_object", "schema": SCHEMA}), ENDPOINT)
    assert body == {**BASE, "structured_outputs": {"json": SCHEMA}}


@pytest.mark.parametrize(
    "response_format",
    [{"type": "json_object"}, {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}],
)
def test_other_response_formats_pass_through(response_format: dict[str, Any]) -> None:
    _, body, _ = build(ADAPTER, request(response_format=response_format), ENDPOINT)
    assert body == {**BASE, "response_format": response_format}


def test_native_extensions_and_openai_fields() -> None:
    req = request(
        max_tokens=16,
        top_k=20,
        include_stop_str_in_output=True,
        stop="###",
        n=2,
        best_of=4,
        seed=3,
        echo=True,
        suffix="s",
    )
    up, body, _ = build(ADAPTER, req, ENDPOINT)
    assert up.url == "http://127.0.0.1:8000/v1/completions"
    assert up.headers == {"content-type": "application/json", "accept": "application/json"}
    assert body == {
        **BASE,
        "max_tokens": 16,
        "top_k": 20,
        "include_stop_str_in_output": True,
        "stop": ["###"],
        "n": 2,
        "best_of": 4,
        "seed": 3,
        "echo": True,
        "suffix": "s",
    }


def test_logprobs_up_to_twenty() -> None:
    _, body, _ = build(ADAPTER, request(logprobs=True, top_logprobs=20), ENDPOINT)
    assert body == {**BASE, "logprobs": 20}


def test_api_key_when_configured_and_streaming() -> None:
    endpoint = Endpoint(provider="local", model=MODEL, base_url="http://gpu-1:8000/v1/", api_key="vk")
    up, body, _ = build(ADAPTER, request(stream=True), endpoint)
    assert up.url == "http://gpu-1:8000/v1/completions"
    assert up.headers["authorization"] == "Bearer vk"
    assert body == {**BASE, "stream": True, "stream_options": {"include_usage": True}}


def test_unknown_to_vllm_is_still_refused() -> None:
    with pytest.raises(UnsupportedParamError) as info:
        build(ADAPTER, request(images=["data:image/png;base64,AA=="]), ENDPOINT)
    assert info.value.param == "images"


def test_recording_drops_stop_reason() -> None:
    out = ADAPTER.parse_response(fixture_bytes("vllm/completion_opt125m.json"), context(["x"]))
    assert as_json(out) == {
        "object": "text_completion",
        "id": "cmpl-gateway-test-id",
        "created": 1729072359,
        "model": "client/model-string",
        "choices": [
            {
                "text": "\n\nTelemetry is an important part of the Open Telemetry community.\n\nPeople who are",
                "index": 0,
                "logprobs": None,
                "finish_reason": "length",
            }
        ],
        "usage": {"prompt_tokens": 20, "completion_tokens": 20, "total_tokens": 40},
    }


def test_an_aborted_generation_is_an_upstream_failure_not_an_answer() -> None:
    """vLLM ends a request its engine gave up (a shutdown, a pause, a scale-down) with finish_reason `abort`:
    its partial text is no answer (never reported finished, never stored), and another target may give one."""
    recorded = json.loads(fixture_bytes("vllm/completion_opt125m.json"))
    recorded["choices"][0]["finish_reason"] = "abort"
    body = json.dumps(recorded).encode()
    for parse in (ADAPTER.parse_response, lambda b, ctx: ADAPTER.parse_event(None, b, ctx)):
        with pytest.raises(UpstreamStatusError) as info:
            parse(body, context(["x"]))
        assert (info.value.code, info.value.status, info.value.retryable) == ("generation_error", 502, True)
    chat = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Partial"}, "finish_reason": "abort"}],
    }
    ctx = CallContext(id="chatcmpl-test", created=1, model="m", chat=True)
    with pytest.raises(UpstreamStatusError):
        ADAPTER.parse_chat_response(json.dumps(chat).encode(), ctx)
    aborted = [{"index": 0, "delta": {}, "finish_reason": "abort"}]
    chunk = {**chat, "object": "chat.completion.chunk", "choices": aborted}
    with pytest.raises(UpstreamStatusError):
        ADAPTER.parse_chat_event(None, json.dumps(chunk).encode(), ctx)
