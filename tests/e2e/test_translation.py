"""What reaches each upstream: translated fields, credentials, URLs, and unsupported parameters.

The loopback upstream records every request, so each test checks both sides: what the client got and
exactly what the provider was sent.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.helpers.clients import sse_data
from tests.helpers.errors import ALL_ROUTES, PAIS_ROUTE, SGP_ROUTE, assert_error
from tests.helpers.recordings import fixture_bytes, fixture_json, sse_events
from tests.helpers.servers import GatewayThread
from tests.helpers.upstreams import Upstream, reply, reply_sse

from .conftest import AZURE_EU_KEY, AZURE_US_KEY, FULL_KEY, SGP_UPSTREAM_KEY, unsalted

DAVINCI = "openai/completion_davinci002.json"
DAVINCI_STREAM = "openai/completion_stream_davinci002.sse.txt"
TOGETHER = "together/completion_mixtral_length.json"
VLLM = "vllm/completion_opt125m.json"

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}


# -- unsupported parameters ------------------------------------------------------------------------


@pytest.mark.parametrize("route", ALL_ROUTES)
@pytest.mark.parametrize(
    ("model", "extra", "param", "message"),
    [
        pytest.param(
            "together/mistralai/Mixtral-8x7B-Instruct-v0.1",
            {"guided_json": SCHEMA},
            "guided_json",
            "Parameter 'guided_json' is not supported by provider 'together'",
            id="together-guided-json",
        ),
        pytest.param(
            "pais/llama-3-8b",
            {"top_p": 0.9},
            "top_p",
            "Parameter 'top_p' is not supported by provider 'pais'",
            id="pais-top-p",
        ),
        pytest.param(
            "pais/llama-3-8b",
            {"prompt": [101, 102, 103]},
            "prompt",
            "Provider 'pais' accepts only a single string prompt",
            id="pais-prompt-token-ids",
        ),
        pytest.param(
            "openai/davinci-002",
            {"logprobs": True, "top_logprobs": 10},
            "top_logprobs",  # the field the client set to 10, though the count is checked as `logprobs`
            "Provider 'openai' returns at most 5 logprobs, got 10",
            id="openai-top-logprobs-10",
        ),
        pytest.param(
            "deepseek/deepseek-chat",
            {"n": 2},
            "n",
            "Parameter 'n' is not supported by provider 'deepseek'",
            id="deepseek-n",
        ),
        pytest.param(
            "demo/text",
            {"suffix": "}"},
            "suffix",
            "Parameter 'suffix' is not supported by provider 'demo'",
            id="fake-suffix",
        ),
    ],
)
def test_unsupported_param_is_400_naming_param_and_provider(
    api: httpx.Client, upstream: Upstream, route: str, model: str, extra: dict[str, Any], param: str, message: str
) -> None:
    resp = api.post(route, json={"model": model, "prompt": "Say this is a test", **extra})
    assert_error(
        resp,
        route,
        status=400,
        type="invalid_request_error",
        param=param,
        code="unsupported_parameter",
        message=message,
    )
    assert upstream.received == []


def test_drop_policy_removes_unsupported_params(oai: openai.OpenAI, upstream: Upstream) -> None:
    upstream.handler = reply(fixture_bytes(TOGETHER))
    raw = oai.completions.with_raw_response.create(
        model="together-drop/mistralai/Mixtral-8x7B-Instruct-v0.1",
        prompt="Tell me a joke",
        max_tokens=512,
        seed=7,
        user="user-1234",
        extra_body={"top_k": 40, "guided_json": SCHEMA},
    )
    assert raw.status_code == 200
    # Listed in the request struct's field order.
    assert raw.headers["x-gateway-dropped-params"] == "seed,guided_json,user"
    assert raw.headers["x-gateway-provider"] == "together-drop"
    completion = raw.parse()
    assert completion.model == "together-drop/mistralai/Mixtral-8x7B-Instruct-v0.1"
    assert completion.choices[0].finish_reason == "length"
    sent = upstream.only()
    assert sent.path == "/together/v1/completions"
    assert sent.json() == {
        "model": "mistralai/Mixtral-8x7B-Instruct-v0.1",
        "prompt": "Tell me a joke",
        "max_tokens": 512,
        "top_k": 40,
    }


def test_drop_policy_without_anything_to_drop_sends_no_header(api: httpx.Client, upstream: Upstream) -> None:
    upstream.handler = reply(fixture_bytes(TOGETHER))
    resp = api.post("/v1/completions", json={"model": "together-drop/m", "prompt": "x", "top_k": 5})
    assert resp.status_code == 200, resp.text
    assert "x-gateway-dropped-params" not in resp.headers
    assert upstream.only().json() == {"model": "m", "prompt": "x", "top_k": 5}


# -- vLLM: structured outputs ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("guided_json", SCHEMA, {"structured_outputs": {"json": SCHEMA}}),
        ("guided_regex", "[a-z]+@example\\.com", {"structured_outputs": {"regex": "[a-z]+@example\\.com"}}),
        ("guided_choice", ["yes", "no"], {"structured_outputs": {"choice": ["yes", "no"]}}),
        ("guided_grammar", 'root ::= "a"', {"structured_outputs": {"grammar": 'root ::= "a"'}}),
        ("response_format", {"type": "json_object", "schema": SCHEMA}, {"structured_outputs": {"json": SCHEMA}}),
        ("response_format", {"type": "json_object"}, {"response_format": {"type": "json_object"}}),
    ],
)
def test_vllm_structured_outputs(
    api: httpx.Client, upstream: Upstream, field: str, value: Any, expected: dict[str, Any]
) -> None:
    upstream.handler = reply(fixture_bytes(VLLM))
    resp = api.post("/v1/completions", json={"model": "vllm/facebook/opt-125m", "prompt": "x", field: value})
    assert resp.status_code == 200, resp.text
    assert unsalted(upstream.only().json()) == {"model": "facebook/opt-125m", "prompt": "x", **expected}


def test_sgp_dialect_request_into_vllm(bare: httpx.Client, upstream: Upstream) -> None:
    """SGP's names (x-api-key, max_new_tokens, stop_sequences, return_token_log_probs, guided_json)
    arrive at vLLM as its own fields."""
    upstream.handler = reply(fixture_bytes(VLLM))
    resp = bare.post(
        SGP_ROUTE,
        headers={"x-api-key": FULL_KEY},
        json={
            "model": "vllm/meta-llama/Llama-3.1-8B",
            "prompt": "Name a person as JSON:",
            "max_new_tokens": 20,
            "stop_sequences": ["\n\n"],
            "return_token_log_probs": True,
            "guided_json": SCHEMA,
            "top_k": 5,
            "include_stop_str_in_output": False,
            "temperature": 0,
        },
    )
    assert resp.status_code == 200, resp.text
    assert resp.json()["model"] == "vllm/meta-llama/Llama-3.1-8B"
    assert unsalted(upstream.only().json()) == {
        "model": "meta-llama/Llama-3.1-8B",
        "prompt": "Name a person as JSON:",
        "max_tokens": 20,
        "temperature": 0,
        "top_k": 5,
        "stop": ["\n\n"],
        "include_stop_str_in_output": False,
        "logprobs": 0,
        "structured_outputs": {"json": SCHEMA},
    }


def test_token_id_prompts_pass_through(api: httpx.Client, upstream: Upstream) -> None:
    # The recording answers one prompt: its choice again, numbered 1, answers the second.
    answer = json.loads(fixture_bytes(VLLM))
    answer["choices"].append({**answer["choices"][0], "index": 1})
    upstream.handler = reply(json.dumps(answer).encode())
    resp = api.post("/v1/completions", json={"model": "vllm/facebook/opt-125m", "prompt": [[2, 31414], [2, 100]]})
    assert resp.status_code == 200, resp.text
    assert [c["index"] for c in resp.json()["choices"]] == [0, 1]
    assert unsalted(upstream.only().json()) == {"model": "facebook/opt-125m", "prompt": [[2, 31414], [2, 100]]}


# -- SGP as an upstream ----------------------------------------------------------------------------
# No SGP response was ever recorded (fixtures INDEX.md); seed 003 documents the OpenAI Completion shape,
# so the loopback SGP replays the recorded OpenAI completion.


def test_sgp_upstream_gets_x_api_key_and_its_own_logprobs(api: httpx.Client, upstream: Upstream) -> None:
    upstream.handler = reply(fixture_bytes(DAVINCI))
    resp = api.post(
        "/v1/completions",
        json={
            "model": "sgp/openai/gpt-3.5-turbo-instruct",
            "prompt": "Say this is a test",
            "max_tokens": 16,
            "logprobs": 3,
            "guided_regex": "[a-z ]+",
            "inference_extra_params": {"repetition_penalty": 1.1},
            "inference_extra_headers": {"x-request-tag": "e2e-42"},
        },
    )
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["model"] == "sgp/openai/gpt-3.5-turbo-instruct"
    assert body["choices"][0]["text"] == "-go library\nS-dmssea 2020-08-13: How"
    sent = upstream.only()
    assert (sent.method, sent.path) == ("POST", "/sgp/v4/beta/completions")
    assert sent.headers["x-api-key"] == SGP_UPSTREAM_KEY
    assert "authorization" not in sent.headers
    assert sent.headers["x-selected-account-id"] == "acct-e2e"
    assert sent.headers["x-request-tag"] == "e2e-42"
    assert sent.json() == {
        "model": "openai/gpt-3.5-turbo-instruct",
        "prompt": "Say this is a test",
        "max_tokens": 16,
        "logprobs": True,
        "top_logprobs": 3,
        "guided_regex": "[a-z ]+",
        "repetition_penalty": 1.1,
    }


def test_sgp_upstream_return_token_log_probs(bare: httpx.Client, upstream: Upstream) -> None:
    upstream.handler = reply(fixture_bytes(DAVINCI))
    resp = bare.post(
        SGP_ROUTE,
        headers={"x-api-key": FULL_KEY},
        json={"model": "sgp/openai/gpt-3.5-turbo-instruct", "prompt": "x", "return_token_log_probs": True},
    )
    assert resp.status_code == 200, resp.text
    assert upstream.only().json() == {"model": "openai/gpt-3.5-turbo-instruct", "prompt": "x", "logprobs": True}


# -- Azure -----------------------------------------------------------------------------------------
# The only Azure recording is a chat completion; Azure's legacy completions answer OpenAI's Completion
# shape, so the loopback Azure replays the recorded OpenAI completion.


@pytest.mark.parametrize(
    ("model", "path", "version", "key"),
    [
        (
            "azure/gpt-35-instruct",
            "/azure-us/openai/deployments/gpt-35-instruct/completions",
            "2024-02-01",
            AZURE_US_KEY,
        ),
        (
            "azure/gpt-35-instruct/eu",
            "/azure-eu/openai/deployments/gpt-35-instruct/completions",
            "2024-06-01",
            AZURE_EU_KEY,
        ),
    ],
)
def test_azure_url_version_and_api_key(
    api: httpx.Client, upstream: Upstream, model: str, path: str, version: str, key: str
) -> None:
    upstream.handler = reply(fixture_bytes(DAVINCI))
    resp = api.post("/v1/completions", json={"model": model, "prompt": "Say this is a test", "max_tokens": 16})
    assert resp.status_code == 200, resp.text
    assert resp.json()["model"] == model
    sent = upstream.only()
    assert (sent.path, sent.query) == (path, {"api-version": version})
    assert sent.headers["api-key"] == key
    assert "authorization" not in sent.headers
    assert sent.json() == {"model": "gpt-35-instruct", "prompt": "Say this is a test", "max_tokens": 16}


# -- PAIS and Fireworks as upstreams ---------------------------------------------------------------

# Seed 004's documented example response (no PAIS response was ever recorded).
PAIS_SEED_RESPONSE = {
    "choices": [{"finish_reason": "length", "index": 0, "text": "Hello! I am an AI Assistant!"}],
    "created": 1589478378,
    "id": "cmpl-123",
    "model": "gpt-4",
    "object": "text_completion",
    "usage": {"completion_tokens": 7, "prompt_tokens": 5, "total_tokens": 12},
}


def test_pais_upstream(api: httpx.Client, upstream: Upstream) -> None:
    upstream.handler = reply(json.dumps(PAIS_SEED_RESPONSE).encode())
    resp = api.post(
        PAIS_ROUTE, json={"model": "pais/llama-3-8b", "prompt": "hello", "stop": "\n", "max_tokens": 7, "seed": 1}
    )
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["choices"] == [
        {"text": "Hello! I am an AI Assistant!", "index": 0, "logprobs": None, "finish_reason": "length"}
    ]
    assert body["id"] != "cmpl-123"
    assert body["model"] == "pais/llama-3-8b"
    sent = upstream.only()
    assert sent.path == "/pais/api/v1/compatibility/openai/v1/completions"
    # A bare stop string becomes the non-empty array the seed requires; the PAIS route's temperature default is 0.
    assert sent.json() == {
        "model": "llama-3-8b",
        "prompt": "hello",
        "stop": ["\n"],
        "max_tokens": 7,
        "seed": 1,
        "temperature": 0,
    }


def test_pais_prompt_list_fans_out_one_call_per_prompt(api: httpx.Client, upstream: Upstream) -> None:
    # PAIS takes one string prompt per call: a list becomes one call per prompt, merged in order.
    upstream.handler = reply(json.dumps(PAIS_SEED_RESPONSE).encode())
    resp = api.post(PAIS_ROUTE, json={"model": "pais/llama-3-8b", "prompt": ["one", "two"], "max_tokens": 7})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert [(c["index"], c["text"]) for c in body["choices"]] == [
        (0, "Hello! I am an AI Assistant!"),
        (1, "Hello! I am an AI Assistant!"),
    ]
    # Usage adds up over the two calls (the seed's example reports 5 + 7 each).
    assert body["usage"] == {"prompt_tokens": 10, "completion_tokens": 14, "total_tokens": 24}
    assert sorted(r.json()["prompt"] for r in upstream.received) == ["one", "two"]


def test_fireworks_route_and_extensions(api: httpx.Client, upstream: Upstream) -> None:
    # No Fireworks completion was ever recorded; its /completions answers OpenAI's shape.
    upstream.handler = reply(fixture_bytes(DAVINCI))
    model = "fireworks/accounts/fireworks/models/llama-v3p1-8b-instruct"
    resp = api.post(
        "/inference/v1/completions",
        json={
            "model": model,
            "prompt": "Say this is a test",
            "top_k": 40,
            "context_length_exceeded_behavior": "truncate",
            "response_format": {"type": "json_object", "schema": SCHEMA},
        },
    )
    assert resp.status_code == 200, resp.text
    assert resp.json()["model"] == model
    sent = upstream.only()
    assert sent.path == "/fireworks/inference/v1/completions"
    assert sent.headers["authorization"] == "Bearer fw-e2e"
    assert sent.json() == {
        "model": "accounts/fireworks/models/llama-v3p1-8b-instruct",
        "prompt": "Say this is a test",
        "top_k": 40,
        "response_format": {"type": "json_object", "schema": SCHEMA},
        "context_length_exceeded_behavior": "truncate",
    }


def test_fireworks_keeps_the_stop_sequence_so_the_gateway_cuts_it(api: httpx.Client, upstream: Upstream) -> None:
    # Seed 001: "The returned text will contain the stop sequence." The recorded answer's shape, its text
    # ending with the stop as Fireworks sends it; an OpenAI client gets OpenAI's text, without it.
    rec = fixture_json(DAVINCI)
    rec["choices"][0]["text"] = "The capital of France is Paris"
    rec["choices"][0]["finish_reason"] = "stop"
    upstream.handler = reply(json.dumps(rec).encode())
    model = "fireworks/accounts/fireworks/models/llama-v3p1-8b-instruct"
    cut = api.post("/v1/completions", json={"model": model, "prompt": "Q:", "stop": ["Paris"]})
    assert cut.status_code == 200, cut.text
    assert cut.json()["choices"][0]["text"] == "The capital of France is "
    assert upstream.only().json()["stop"] == ["Paris"]  # still sent: generation ends there
    upstream.received.clear()
    kept = api.post(
        "/v1/completions", json={"model": model, "prompt": "Q:", "stop": ["Paris"], "include_stop_str_in_output": True}
    )
    assert kept.status_code == 200, kept.text
    assert kept.json()["choices"][0]["text"] == "The capital of France is Paris"
    assert "include_stop_str_in_output" not in upstream.only().json()


# -- multiple prompts x n through an OpenAI-compatible upstream ------------------------------------


def _multi_choice_body(prompts: int, n: int) -> bytes:
    """Synthesized from the recorded davinci completion's shape: one choice per (prompt, j), indexed
    prompt_index * n + j as OpenAI documents; no multi-prompt response was ever recorded."""
    rec = fixture_json(DAVINCI)
    template = rec["choices"][0]
    rec["choices"] = [
        {**copy.deepcopy(template), "text": f"p{i}-c{j}", "index": i * n + j} for i in range(prompts) for j in range(n)
    ]
    return json.dumps(rec).encode()


def test_multi_prompt_times_n_via_upstream(oai: openai.OpenAI, upstream: Upstream) -> None:
    upstream.handler = reply(_multi_choice_body(prompts=3, n=2))
    completion = oai.completions.create(model="openai/davinci-002", prompt=["a", "b", "c"], n=2, max_tokens=16)
    assert [(c.index, c.text) for c in completion.choices] == [
        (0, "p0-c0"),
        (1, "p0-c1"),
        (2, "p1-c0"),
        (3, "p1-c1"),
        (4, "p2-c0"),
        (5, "p2-c1"),
    ]
    assert upstream.only().json() == {"model": "davinci-002", "prompt": ["a", "b", "c"], "n": 2, "max_tokens": 16}


def test_multi_prompt_times_n_stream_via_upstream(api: httpx.Client, upstream: Upstream) -> None:
    # Interleaved chunks for 2 prompts x n=2, each built from a recorded davinci stream chunk.
    template = json.loads(sse_events(fixture_bytes(DAVINCI_STREAM))[0][len(b"data: ") :])
    events = []
    for step in range(2):
        for index in (3, 0, 2, 1):
            chunk = copy.deepcopy(template)
            chunk["choices"][0].update(
                text=f"<{index}.{step}>", index=index, finish_reason="length" if step == 1 else None
            )
            events.append(b"data: " + json.dumps(chunk).encode())
    upstream.handler = reply_sse([*events, b"data: [DONE]"])
    resp = api.post(
        "/v1/completions", json={"model": "openai/davinci-002", "prompt": ["a", "b"], "n": 2, "stream": True}
    )
    assert resp.status_code == 200, resp.text
    data = sse_data(resp.text)
    assert data[-1] == "[DONE]"
    texts: dict[int, str] = {}
    for chunk in map(json.loads, data[:-1]):
        (choice,) = chunk["choices"]
        texts[choice["index"]] = texts.get(choice["index"], "") + choice["text"]
    assert texts == {0: "<0.0><0.1>", 1: "<1.0><1.1>", 2: "<2.0><2.1>", 3: "<3.0><3.1>"}


# -- the global drop policy ------------------------------------------------------------------------

GLOBAL_DROP = """
unsupported_params: drop
providers:
  demo: {kind: fake}
  strict-demo: {kind: fake, unsupported_params: error}
"""


def test_global_drop_policy_and_per_provider_override(tmp_path: Path) -> None:
    path = tmp_path / "drop.yaml"
    path.write_text(GLOBAL_DROP)
    body = {"model": "demo/echo", "prompt": "a b", "suffix": "}", "guided_regex": "[a-z]+"}
    with GatewayThread(path, {}) as gw, httpx.Client(base_url=gw.url, trust_env=False, timeout=10) as client:
        resp = client.post(SGP_ROUTE, json=body)
        assert resp.status_code == 200, resp.text
        assert resp.headers["x-gateway-dropped-params"] == "suffix,guided_regex"
        assert resp.json()["choices"][0]["text"] == "a b"
        resp = client.post("/v1/completions", json={**body, "model": "strict-demo/echo"})
        assert_error(
            resp,
            "/v1/completions",
            status=400,
            type="invalid_request_error",
            param="suffix",
            code="unsupported_parameter",
            message="Parameter 'suffix' is not supported by provider 'strict-demo'",
        )
