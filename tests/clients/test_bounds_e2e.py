"""Issue 12, items 1 and 2, end to end: bounds are the provider's, and provider-native fields pass through.

The gateway (uvicorn, real socket) in front of one loopback upstream that answers each provider's path with
its real recording (tests/fixtures, see SOURCES.md): OpenAI `completion_davinci002` (plain and streamed),
vLLM `completion_opt125m`, TGI `generate_details_length`, Ollama `generate_nonstream`. Clients are the
official `openai` SDK (with `extra_body`, as LangChain and lm-eval's `--gen_kwargs` send native fields) and
raw httpx for exact error bodies.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from aiohttp import web

from tests.helpers.clients import openai_client, sse_data
from tests.helpers.errors import assert_error
from tests.helpers.recordings import fixture_bytes, sse_events
from tests.helpers.servers import GatewayThread, serve_config
from tests.helpers.upstreams import Received, Upstream, reply, reply_sse

OPENAI_KEY = "sk-upstream-bounds-e2e"
CONFIG = """
unsupported_params: error
retries: {{attempts: 1}}
providers:
  openai: {{kind: openai, api_key: {key}, base_url: "{url}/openai/v1"}}
  lenient: {{kind: openai, api_key: {key}, base_url: "{url}/lenient/v1", unsupported_params: drop}}
  local: {{kind: vllm, base_url: "{url}/vllm/v1"}}
  small: {{kind: vllm, base_url: "{url}/small/v1", max_logprobs: 8}}
  hf: {{kind: tgi, base_url: "{url}/tgi"}}
  ol: {{kind: ollama, base_url: "{url}/ollama"}}
"""
VLLM = "local/facebook/opt-125m"
# What lm-eval's humaneval task stops on: six sequences (OpenAI takes four).
SIX = ["\nclass", "\ndef", "\n#", "\nif", "\nS-", ": How"]
# The same four first ones, then two found in the streamed recording's text.
SIX_STREAMED = ["\nclass", "\ndef", "\n#", "\nif", " python", " JSON"]
NATIVE = {"repetition_penalty": 1.2, "min_p": 0.05, "top_k": 40}


async def _recordings(request: web.Request, received: Received) -> web.StreamResponse:
    """Each provider's path answered with its own recording."""
    path = received.path
    if path.startswith(("/openai/", "/lenient/")):
        if received.json().get("stream"):
            return await reply_sse(sse_events(fixture_bytes("openai/completion_stream_davinci002.sse.txt")))(
                request, received
            )
        return await reply(fixture_bytes("openai/completion_davinci002.json"))(request, received)
    if path.startswith(("/vllm/", "/small/")):
        return await reply(fixture_bytes("vllm/completion_opt125m.json"))(request, received)
    if path == "/tgi/generate":
        return await reply(fixture_bytes("tgi/generate_details_length.json"))(request, received)
    if path == "/ollama/api/generate":
        return await reply(fixture_bytes("ollama/generate_nonstream.json"))(request, received)
    return web.Response(status=599, text=f"no recording for {path}")


@pytest.fixture
def upstream(upstream_server: Upstream) -> Iterator[Upstream]:
    upstream_server.reset()
    upstream_server.handler = _recordings
    yield upstream_server
    upstream_server.reset()


@pytest.fixture(scope="module")
def gateway(upstream_server: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayThread]:
    with serve_config(tmp_path_factory.mktemp("bounds"), CONFIG.format(key=OPENAI_KEY, url=upstream_server.url)) as gw:
        yield gw


@pytest.fixture
def oai(gateway: GatewayThread) -> Iterator[openai.OpenAI]:
    gateway.pipeline.health.reset()
    with openai_client(gateway.url + "/v1", "unused-no-keys-configured") as client:
        yield client


@pytest.fixture
def api(gateway: GatewayThread) -> Iterator[httpx.Client]:
    gateway.pipeline.health.reset()
    with httpx.Client(base_url=gateway.url, trust_env=False, timeout=15) as client:
        yield client


# --- stop sequences ----------------------------------------------------------------------------------------


def test_six_stops_reach_vllm_all_six(api: httpx.Client, upstream: Upstream) -> None:
    # lm-eval local-completions' generate_until body (a one-prompt batch).
    body = {"model": VLLM, "prompt": ["def f():"], "max_tokens": 256, "temperature": 0, "stop": SIX, "seed": 1234}
    resp = api.post("/v1/completions", json=body)
    assert resp.status_code == 200, resp.text
    sent = upstream.only()
    assert (sent.path, sent.json()["stop"]) == ("/vllm/v1/completions", SIX)
    (choice,) = resp.json()["choices"]
    assert choice["text"].startswith("\n\nTelemetry is an important part")
    assert choice["finish_reason"] == "length"


def test_six_stops_to_openai_send_four_and_the_gateway_enforces_the_rest(
    oai: openai.OpenAI, upstream: Upstream
) -> None:
    completion = oai.completions.create(model="openai/davinci-002", prompt="Say this is a test", stop=SIX)
    sent = upstream.only()
    assert sent.path == "/openai/v1/completions"
    assert sent.json()["stop"] == SIX[:4]
    # The recording says "-go library\nS-dmssea 2020-08-13: How": cut at the fifth stop, which OpenAI never saw.
    assert [(c.text, c.finish_reason, c.index) for c in completion.choices] == [("-go library", "stop", 0)]
    assert completion.usage is not None and completion.usage.total_tokens == 24


def test_six_stops_to_openai_streamed(oai: openai.OpenAI, upstream: Upstream) -> None:
    chunks = list(
        oai.completions.create(model="openai/davinci-002", prompt="Say this is a test", stop=SIX_STREAMED, stream=True)
    )
    assert upstream.only().json()["stop"] == SIX_STREAMED[:4]
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    # The recorded stream reads "-common.\n\nI'm a python microservice that reads a JSON ...".
    assert (text, finishes) == ("-common.\n\nI'm a", ["stop"])


@pytest.mark.parametrize("stream", [False, True])
def test_an_echoed_prompt_is_not_cut_at_a_stop_it_contains(api: httpx.Client, upstream: Upstream, stream: bool) -> None:
    # The prompt holds "\nif", one of the stops: only the completion may be cut, so the gateway echoes it.
    prompt = "def f():\nif x"
    stops = SIX_STREAMED if stream else SIX
    body = {"model": "openai/davinci-002", "prompt": prompt, "echo": True, "stop": stops, "stream": stream}
    resp = api.post("/v1/completions", json=body)
    assert resp.status_code == 200, resp.text
    sent = upstream.only().json()
    assert ("echo" in sent, sent["stop"]) == (False, stops[:4])
    if stream:
        chunks = [json.loads(d) for d in sse_data(resp.text)[:-1]]
        text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
        finishes = [
            c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]
        ]
        assert (text, finishes) == (prompt + "-common.\n\nI'm a", ["stop"])
    else:
        (choice,) = resp.json()["choices"]
        assert (choice["text"], choice["finish_reason"]) == (prompt + "-go library", "stop")


def test_four_stops_to_openai_are_left_to_openai(oai: openai.OpenAI, upstream: Upstream) -> None:
    completion = oai.completions.create(model="openai/davinci-002", prompt="Say this is a test", stop=SIX[:4])
    assert upstream.only().json()["stop"] == SIX[:4]
    assert completion.choices[0].text == "-go library\nS-dmssea 2020-08-13: How"


# --- logprobs ----------------------------------------------------------------------------------------------


def test_ten_logprobs_reach_vllm(oai: openai.OpenAI, upstream: Upstream) -> None:
    # LangChain's OpenAI(logprobs=10) against a vLLM server.
    completion = oai.completions.create(model=VLLM, prompt="Say this is a test", logprobs=10, max_tokens=20)
    assert upstream.only().json()["logprobs"] == 10
    assert completion.choices[0].finish_reason == "length"


def test_ten_logprobs_to_openai_are_refused_naming_the_bound(api: httpx.Client, upstream: Upstream) -> None:
    resp = api.post("/v1/completions", json={"model": "openai/davinci-002", "prompt": "x", "logprobs": 10})
    assert_error(
        resp,
        "/v1/completions",
        status=400,
        type="invalid_request_error",
        message="Provider 'openai' returns at most 5 logprobs, got 10",
        param="logprobs",
        code="unsupported_parameter",
    )
    assert upstream.received == []


def test_configured_max_logprobs_bounds_that_provider(api: httpx.Client, upstream: Upstream) -> None:
    resp = api.post("/v1/completions", json={"model": "small/opt", "prompt": "x", "logprobs": 10})
    assert_error(
        resp,
        "/v1/completions",
        status=400,
        type="invalid_request_error",
        message="Provider 'small' returns at most 8 logprobs, got 10",
        param="logprobs",
        code="unsupported_parameter",
    )
    assert upstream.received == []
    ok = api.post("/v1/completions", json={"model": "small/opt", "prompt": "x", "logprobs": 8})
    assert ok.status_code == 200, ok.text
    assert upstream.only().json()["logprobs"] == 8


# --- provider-native fields --------------------------------------------------------------------------------


# The vLLM recording with the `prompt_logprobs` its protocol adds to a choice when asked for
# (vllm/entrypoints/openai/protocol.py CompletionResponseChoice: list[dict[int, Logprob] | None], a
# Logprob being {logprob, rank, decoded_token}; null for the first prompt token). Values illustrative.
PROMPT_LOGPROBS: list[dict[str, Any] | None] = [
    None,
    {"15": {"logprob": -5.125, "rank": 12, "decoded_token": "Say"}},
    {"42": {"logprob": -2.5, "rank": 1, "decoded_token": " this"}},
]


def test_prompt_logprobs_reach_vllm_and_come_back(api: httpx.Client, upstream: Upstream) -> None:
    recorded = json.loads(fixture_bytes("vllm/completion_opt125m.json"))
    recorded["choices"][0]["prompt_logprobs"] = PROMPT_LOGPROBS
    upstream.handler = reply(json.dumps(recorded).encode())
    resp = api.post("/v1/completions", json={"model": VLLM, "prompt": "Say this", "prompt_logprobs": 1})
    assert resp.status_code == 200, resp.text
    assert upstream.only().json()["prompt_logprobs"] == 1
    assert resp.json()["choices"][0]["prompt_logprobs"] == PROMPT_LOGPROBS


def test_no_prompt_logprobs_key_unless_vllm_sends_them(api: httpx.Client, upstream: Upstream) -> None:
    resp = api.post("/v1/completions", json={"model": VLLM, "prompt": "Say this"})
    assert resp.status_code == 200, resp.text
    assert set(resp.json()["choices"][0]) == {"text", "index", "logprobs", "finish_reason"}


def test_prompt_logprobs_beyond_the_bound_are_refused(api: httpx.Client, upstream: Upstream) -> None:
    resp = api.post("/v1/completions", json={"model": "small/opt", "prompt": "x", "prompt_logprobs": 9})
    assert_error(
        resp,
        "/v1/completions",
        status=400,
        type="invalid_request_error",
        message="Provider 'small' returns at most 8 prompt_logprobs, got 9",
        param="prompt_logprobs",
        code="unsupported_parameter",
    )
    assert upstream.received == []


def test_native_fields_reach_vllms_body(oai: openai.OpenAI, upstream: Upstream) -> None:
    oai.completions.create(model=VLLM, prompt="Say this is a test", extra_body=NATIVE)
    sent: dict[str, Any] = upstream.only().json()
    assert {k: sent[k] for k in NATIVE} == NATIVE


def test_native_fields_reach_tgis_parameters(oai: openai.OpenAI, upstream: Upstream) -> None:
    # TGI has no min_p (GenerateParameters); typical_p is its own.
    tgi = {"repetition_penalty": 1.2, "typical_p": 0.9, "top_k": 40}
    completion = oai.completions.create(model="hf/flan-t5-xxl", prompt="test", max_tokens=1, extra_body=tgi)
    assert completion.choices[0].finish_reason == "length"
    sent = upstream.only()
    assert sent.path == "/tgi/generate"
    assert {k: sent.json()["parameters"][k] for k in tgi} == tgi


def test_a_native_field_tgi_lacks_is_refused_naming_it(api: httpx.Client, upstream: Upstream) -> None:
    resp = api.post("/v1/completions", json={"model": "hf/flan-t5-xxl", "prompt": "test", **NATIVE})
    assert_error(
        resp,
        "/v1/completions",
        status=400,
        type="invalid_request_error",
        message="Parameter 'min_p' is not supported by provider 'hf'",
        param="min_p",
        code="unsupported_parameter",
    )
    assert upstream.received == []


def test_native_fields_reach_ollamas_options(oai: openai.OpenAI, upstream: Upstream) -> None:
    oai.completions.create(model="ol/llama3", prompt="Tell me a joke about OpenTelemetry", extra_body=NATIVE)
    sent = upstream.only()
    assert sent.path == "/ollama/api/generate"
    # Ollama's name for the repetition penalty is repeat_penalty.
    assert {k: sent.json()["options"][k] for k in ("repeat_penalty", "min_p", "top_k")} == {
        "repeat_penalty": 1.2,
        "min_p": 0.05,
        "top_k": 40,
    }


@pytest.mark.parametrize("field", list(NATIVE))
def test_native_fields_to_openai_are_refused_naming_field_and_provider(
    api: httpx.Client, upstream: Upstream, field: str
) -> None:
    resp = api.post("/v1/completions", json={"model": "openai/davinci-002", "prompt": "x", field: NATIVE[field]})
    assert_error(
        resp,
        "/v1/completions",
        status=400,
        type="invalid_request_error",
        message=f"Parameter '{field}' is not supported by provider 'openai'",
        param=field,
        code="unsupported_parameter",
    )
    assert upstream.received == []


def test_native_fields_to_openai_are_dropped_under_the_drop_policy(oai: openai.OpenAI, upstream: Upstream) -> None:
    raw = oai.completions.with_raw_response.create(
        model="lenient/davinci-002", prompt="Say this is a test", temperature=0.5, extra_body=NATIVE
    )
    assert raw.headers["x-gateway-dropped-params"] == "top_k,min_p,repetition_penalty"
    sent: dict[str, Any] = upstream.only().json()
    assert sent["temperature"] == 0.5
    assert not set(NATIVE) & set(sent)
    assert raw.parse().choices[0].text == "-go library\nS-dmssea 2020-08-13: How"
