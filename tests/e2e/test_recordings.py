"""Real recorded provider responses, replayed by a loopback upstream, normalized by the gateway.

Whatever the vendor sent (its own id, `text.completion`, `stop_reason`, an empty id, its model name),
the client sees the gateway's `cmpl-` id, `object: text_completion`, and the model string it sent.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import re
from typing import Any

import httpx
import openai
import pytest
from aiohttp import web

from tests.helpers.clients import async_openai_client, sse_data
from tests.helpers.errors import ALL_ROUTES
from tests.helpers.recordings import fixture_bytes, fixture_headers, fixture_json, sse_events
from tests.helpers.servers import GatewayThread
from tests.helpers.upstreams import Received, Upstream, reply, reply_sse

from .conftest import FULL_KEY, OPENAI_UPSTREAM_KEY

OUR_ID = re.compile(r"^cmpl-[0-9a-f]{24}$")

DAVINCI = "openai/completion_davinci002.json"
DAVINCI_HEADERS = "openai/completion_davinci002.headers.json"
DAVINCI_STREAM = "openai/completion_stream_davinci002.sse.txt"
TOGETHER = "together/completion_mixtral_length.json"
TOGETHER_HEADERS = "together/completion_mixtral_length.headers.json"
TOGETHER_CHAT = "together/chat_logprobs.json"
VLLM = "vllm/completion_opt125m.json"
TGI = "tgi/snapshot_v1_completions_single.json"


def expected_from(recording: str, model: str, completion_id: str, **changes: Any) -> dict[str, Any]:
    """The recording as the gateway must relay it: our id and object, the client's model, no extras."""
    rec = fixture_json(recording)
    out: dict[str, Any] = {
        "object": "text_completion",
        "id": completion_id,
        "created": rec["created"],
        "model": model,
        "choices": [
            {"text": c["text"], "index": c["index"], "logprobs": c["logprobs"], "finish_reason": c["finish_reason"]}
            for c in rec["choices"]
        ],
        "usage": {k: rec["usage"][k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")},
    }
    if rec.get("system_fingerprint"):
        out["system_fingerprint"] = rec["system_fingerprint"]
    out.update(changes)
    return out


def test_openai_davinci_recording(api: httpx.Client, upstream: Upstream) -> None:
    upstream.handler = reply(fixture_bytes(DAVINCI), headers=fixture_headers(DAVINCI_HEADERS))
    resp = api.post(
        "/v1/completions", json={"model": "openai/davinci-002", "prompt": "Tell me a joke about opentelemetry"}
    )
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert OUR_ID.match(body["id"]), body["id"]
    assert body == expected_from(DAVINCI, "openai/davinci-002", body["id"])
    assert list(body) == ["object", "id", "created", "model", "choices", "usage"]
    assert resp.headers["x-gateway-provider"] == "openai"
    assert "x-gateway-dropped-params" not in resp.headers

    sent = upstream.only()
    assert (sent.method, sent.path, sent.query) == ("POST", "/openai/v1/completions", {})
    assert sent.json() == {"model": "davinci-002", "prompt": "Tell me a joke about opentelemetry"}
    # The gateway's own credential goes upstream; the client's key never does.
    assert sent.headers["authorization"] == f"Bearer {OPENAI_UPSTREAM_KEY}"
    assert FULL_KEY not in json.dumps(sent.headers)
    assert sent.headers["content-type"] == "application/json"


def test_each_call_gets_a_fresh_id(api: httpx.Client, upstream: Upstream) -> None:
    upstream.handler = reply(fixture_bytes(DAVINCI))
    ids = {api.post("/v1/completions", json={"model": "davinci", "prompt": "x"}).json()["id"] for _ in range(3)}
    assert len(ids) == 3
    assert all(OUR_ID.match(i) for i in ids)
    # The alias is what the client sent, so it is what the client gets back.
    assert api.post("/v1/completions", json={"model": "davinci", "prompt": "x"}).json()["model"] == "davinci"


def test_openai_sdk_sync(oai: openai.OpenAI, upstream: Upstream) -> None:
    upstream.handler = reply(fixture_bytes(DAVINCI), headers=fixture_headers(DAVINCI_HEADERS))
    completion = oai.completions.create(
        model="openai/davinci-002", prompt="Tell me a joke about opentelemetry", max_tokens=16, temperature=0.7
    )
    assert OUR_ID.match(completion.id)
    assert completion.object == "text_completion"
    assert completion.model == "openai/davinci-002"
    assert completion.created == 1709033850
    assert [(c.index, c.text, c.finish_reason, c.logprobs) for c in completion.choices] == [
        (0, "-go library\nS-dmssea 2020-08-13: How", "length", None)
    ]
    assert completion.usage is not None
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens, completion.usage.total_tokens) == (
        8,
        16,
        24,
    )
    assert upstream.only().json() == {
        "model": "davinci-002",
        "prompt": "Tell me a joke about opentelemetry",
        "max_tokens": 16,
        "temperature": 0.7,
    }


async def test_openai_sdk_async(gateway: GatewayThread, upstream: Upstream) -> None:
    upstream.handler = reply(fixture_bytes(DAVINCI))
    async with async_openai_client(gateway.url + "/v1", FULL_KEY) as client:
        completion = await client.completions.create(model="davinci", prompt="Tell me a joke", max_tokens=16)
    assert OUR_ID.match(completion.id)
    assert completion.model == "davinci"
    assert completion.choices[0].text == "-go library\nS-dmssea 2020-08-13: How"
    assert upstream.only().json() == {"model": "davinci-002", "prompt": "Tell me a joke", "max_tokens": 16}


STREAM_TEXTS = [
    "-common",
    ".\n\n",
    "I",
    "'m",
    " a",
    " python",
    " micro",
    "service",
    " that",
    " reads",
    " a",
    " JSON",
    " configuration",
    " file",
    " in",
    " order",
]


def test_openai_davinci_stream_recording_raw(api: httpx.Client, upstream: Upstream) -> None:
    upstream.handler = reply_sse(sse_events(fixture_bytes(DAVINCI_STREAM)))
    resp = api.post("/v1/completions", json={"model": "openai/davinci-002", "prompt": "Tell me a joke", "stream": True})
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].startswith("text/event-stream")
    assert resp.headers["cache-control"] == "no-cache"
    data = sse_data(resp.text)
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert len(chunks) == 16
    first_id = chunks[0]["id"]
    assert OUR_ID.match(first_id)
    for i, chunk in enumerate(chunks):
        assert chunk == {
            "object": "text_completion",
            "id": first_id,
            "created": 1709033852,
            "model": "openai/davinci-002",
            "choices": [
                {"text": STREAM_TEXTS[i], "index": 0, "logprobs": None, "finish_reason": "length" if i == 15 else None}
            ],
        }
    sent = upstream.only().json()
    # The gateway always asks for the usage chunk; the client did not, so it gets none (see test_streaming).
    assert sent == {
        "model": "davinci-002",
        "prompt": "Tell me a joke",
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def test_openai_davinci_stream_recording_sdk(oai: openai.OpenAI, upstream: Upstream) -> None:
    upstream.handler = reply_sse(sse_events(fixture_bytes(DAVINCI_STREAM)))
    with oai.completions.create(model="openai/davinci-002", prompt="Tell me a joke", stream=True) as stream:
        chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks) == "".join(STREAM_TEXTS)
    assert {c.id for c in chunks} == {chunks[0].id}
    assert OUR_ID.match(chunks[0].id)
    assert [c.choices[0].finish_reason for c in chunks][-2:] == [None, "length"]


async def test_openai_davinci_stream_recording_async_sdk(gateway: GatewayThread, upstream: Upstream) -> None:
    upstream.handler = reply_sse(sse_events(fixture_bytes(DAVINCI_STREAM)))
    async with async_openai_client(gateway.url + "/v1", FULL_KEY) as client:
        stream = await client.completions.create(model="davinci", prompt="Tell me a joke", stream=True)
        texts = [c.choices[0].text async for c in stream]
    assert texts == STREAM_TEXTS


def test_together_recording(api: httpx.Client, upstream: Upstream) -> None:
    upstream.handler = reply(fixture_bytes(TOGETHER), headers=fixture_headers(TOGETHER_HEADERS))
    model = "together/mistralai/Mixtral-8x7B-Instruct-v0.1"
    resp = api.post("/v1/completions", json={"model": model, "prompt": "Tell me a joke about opentelemetry"})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    # "text.completion" becomes "text_completion"; Together's extra "prompt": [] is not relayed.
    assert body == expected_from(TOGETHER, model, body["id"])
    assert body["object"] == "text_completion"
    assert "prompt" not in body
    assert OUR_ID.match(body["id"])
    sent = upstream.only()
    assert sent.path == "/together/v1/completions"
    assert sent.json() == {
        "model": "mistralai/Mixtral-8x7B-Instruct-v0.1",
        "prompt": "Tell me a joke about opentelemetry",
    }
    assert sent.headers["authorization"] == "Bearer together-e2e"


def test_together_echo_is_the_gateways(api: httpx.Client, upstream: Upstream) -> None:
    """Together answers `echo` with the prompt in a list beside the choices (its OpenAPI spec's
    `CompletionResponse.prompt`), never in a choice's text: the gateway echoes, and Together is asked for the
    recorded answer without it. With logprobs the prompt's would be missing: a 400 naming `echo`."""
    # Without the recorded headers, whose exhausted counter would cool the target for the second request.
    upstream.handler = reply(fixture_bytes(TOGETHER))
    model = "together/mistralai/Mixtral-8x7B-Instruct-v0.1"
    prompt = "Tell me a joke about opentelemetry"
    resp = api.post("/v1/completions", json={"model": model, "prompt": prompt, "echo": True})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    recorded = fixture_json(TOGETHER)["choices"][0]
    assert [(c["text"], c["finish_reason"]) for c in body["choices"]] == [(prompt + recorded["text"], "length")]
    assert upstream.only().json() == {"model": "mistralai/Mixtral-8x7B-Instruct-v0.1", "prompt": prompt}

    resp = api.post("/v1/completions", json={"model": model, "prompt": prompt, "echo": True, "logprobs": 1})
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == "echo"
    assert len(upstream.received) == 1  # the first call's: the refused one never went upstream


def test_together_chat_logprobs_reach_the_sdk_in_openais_shape(oai: openai.OpenAI, upstream: Upstream) -> None:
    """Together answers chat logprobs in the completions shape (and a stream's as one number per chunk): the
    official client reads them as OpenAI's `logprobs.content`, buffered and streamed."""
    upstream.handler = reply(fixture_bytes(TOGETHER_CHAT))
    model = "together/meta-llama/Meta-Llama-3.1-8B-Instruct-Turbo"
    messages: Any = [{"role": "user", "content": "how are you today"}]
    answer = oai.chat.completions.create(model=model, messages=messages, logprobs=True, top_logprobs=1)
    recorded = fixture_json(TOGETHER_CHAT)["choices"][0]["logprobs"]
    logprobs = answer.choices[0].logprobs
    assert logprobs is not None and logprobs.content is not None
    assert [(t.token, t.logprob) for t in logprobs.content] == list(
        zip(recorded["tokens"], recorded["token_logprobs"], strict=True)
    )
    assert [[(a.token, a.logprob) for a in t.top_logprobs] for t in logprobs.content] == [
        list(m.items()) for m in recorded["top_logprobs"]
    ]
    sent = upstream.only().json()
    assert sent["logprobs"] == 1 and "top_logprobs" not in sent

    # Stream chunks as together-python types them (`ChatCompletionChoicesChunk.logprobs: float`).
    chunk: dict[str, Any] = {
        "id": "oBUtQrM-62bZhn-9801a1ac2a5f9b29",
        "object": "chat.completion.chunk",
        "created": 1758039001,
        "model": "m",
        "choices": [{"index": 0, "delta": {"role": "assistant", "content": "The"}, "logprobs": -0.25}],
    }
    last = {**chunk, "choices": [{"index": 0, "delta": {"content": " Sun"}, "logprobs": -1.5, "finish_reason": "stop"}]}
    upstream.handler = reply_sse([b"data: " + json.dumps(c).encode() for c in (chunk, last)] + [b"data: [DONE]"])
    with oai.chat.completions.create(model=model, messages=messages, logprobs=True, stream=True) as stream:
        tokens = [
            (t.token, t.logprob)
            for c in stream
            for ch in c.choices
            for t in (ch.logprobs and ch.logprobs.content) or ()
        ]
    assert tokens == [("The", -0.25), (" Sun", -1.5)]


@pytest.mark.parametrize("route", ALL_ROUTES)
def test_vllm_recording_on_every_route(api: httpx.Client, upstream: Upstream, route: str) -> None:
    upstream.handler = reply(fixture_bytes(VLLM))
    resp = api.post(route, json={"model": "vllm/facebook/opt-125m", "prompt": "Tell me about OpenTelemetry"})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    # vLLM's choices[].stop_reason is dropped; its usage key order does not matter.
    assert body == expected_from(VLLM, "vllm/facebook/opt-125m", body["id"])
    assert "stop_reason" not in body["choices"][0]
    assert body["usage"] == {"prompt_tokens": 20, "completion_tokens": 20, "total_tokens": 40}
    sent = upstream.only()
    assert sent.path == "/vllm/v1/completions"
    assert "authorization" not in sent.headers  # a local vLLM without api_key gets no credentials


def test_tgi_recording_with_empty_id(api: httpx.Client, upstream: Upstream) -> None:
    upstream.handler = reply(fixture_bytes(TGI))
    model = "tgi/meta-llama/Llama-3.1-8B-Instruct"
    resp = api.post("/v1/completions", json={"model": model, "prompt": "What is Deep Learning?", "max_tokens": 10})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert OUR_ID.match(body["id"])
    assert body == expected_from(TGI, model, body["id"])
    assert body["system_fingerprint"] == "3.1.2-dev0-native"
    assert upstream.only().json() == {
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "prompt": "What is Deep Learning?",
        "max_tokens": 10,
    }


async def test_concurrent_requests_get_their_own_answers(gateway: GatewayThread, upstream: Upstream) -> None:
    """20 concurrent SDK calls over the gateway's pooled upstream connections: no answer crosses over."""
    template = fixture_json(DAVINCI)

    async def echo_prompt(request: web.Request, received: Received) -> web.StreamResponse:
        # The recorded completion with its text replaced by the prompt, so each answer is traceable.
        body = json.loads(json.dumps(template))
        body["choices"][0]["text"] = received.json()["prompt"]
        await asyncio.sleep(0.05)
        return web.json_response(body)

    upstream.handler = echo_prompt
    async with async_openai_client(gateway.url + "/v1", FULL_KEY) as client:
        results = await asyncio.gather(
            *(client.completions.create(model="openai/davinci-002", prompt=f"prompt-{i}") for i in range(20))
        )
    assert [r.choices[0].text for r in results] == [f"prompt-{i}" for i in range(20)]
    assert len({r.id for r in results}) == 20
    assert sorted(r.json()["prompt"] for r in upstream.received) == sorted(f"prompt-{i}" for i in range(20))


def test_gzip_encoded_upstream_body(api: httpx.Client, upstream: Upstream) -> None:
    # The davinci cassette stored this body gzip-encoded (fixtures INDEX.md); serve it that way again.
    async def gzipped(request: web.Request, received: Received) -> web.StreamResponse:
        assert "gzip" in received.headers.get("accept-encoding", "")
        return web.Response(
            body=gzip.compress(fixture_bytes(DAVINCI)),
            headers={"content-type": "application/json", "content-encoding": "gzip"},
        )

    upstream.handler = gzipped
    resp = api.post("/v1/completions", json={"model": "openai/davinci-002", "prompt": "x"})
    assert resp.status_code == 200, resp.text
    assert resp.json() == expected_from(DAVINCI, "openai/davinci-002", resp.json()["id"])
