"""Text answers on the chat route, plain and streamed: OpenAI's recorded answer through the SDK, Azure's
recorded stream as relayed server-sent events, and the in-process fake provider."""

from __future__ import annotations

import json

import httpx
import openai

from tests.clients.chat.upstreams import data, sse
from tests.helpers.recordings import fixture_json
from tests.helpers.upstreams import Received


def test_create(client: openai.OpenAI, received: list[Received]) -> None:
    recorded = fixture_json("openai/chat_completion.json")
    answer = client.chat.completions.create(
        model="oa/gpt-3.5-turbo", messages=[{"role": "user", "content": "Tell me a joke"}], max_tokens=40, seed=3
    )
    assert answer.object == "chat.completion" and answer.id.startswith("chatcmpl-")
    assert answer.model == "oa/gpt-3.5-turbo"
    assert answer.choices[0].message.role == "assistant"
    assert answer.choices[0].message.content == recorded["choices"][0]["message"]["content"]
    assert answer.choices[0].finish_reason == "stop"
    assert answer.usage is not None and answer.usage.total_tokens == recorded["usage"]["total_tokens"]
    assert answer.system_fingerprint == recorded["system_fingerprint"]
    (sent,) = received
    assert sent.path == "/v1/chat/completions"
    assert sent.headers["authorization"] == "Bearer sk-upstream"
    body = sent.json()
    # OpenAI's current name for the limit: its o-series models refuse `max_tokens`.
    assert body == {
        "model": "gpt-3.5-turbo",
        "messages": [{"role": "user", "content": "Tell me a joke"}],
        "max_completion_tokens": 40,
        "seed": 3,
    }


def test_stream_text_and_done(api: httpx.Client) -> None:
    recorded = data(sse("azure/chat_stream_usage.sse.txt"))
    text = "".join(ch["delta"].get("content") or "" for c in recorded for ch in c["choices"])
    body = {"model": "oa/gpt-4.1-mini", "messages": [{"role": "user", "content": "a joke"}], "stream": True}
    with api.stream("POST", "/v1/chat/completions", json=body) as resp:
        assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
        events = [line for line in resp.iter_lines() if line]
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e[len("data: ") :]) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    # Azure's prompt-filter event carries nothing for the client: it is not relayed.
    assert all(c["choices"] for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == text
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_fake_provider(client: openai.OpenAI) -> None:
    plain = client.chat.completions.create(model="demo/echo", messages=[{"role": "user", "content": "hi"}])
    assert plain.choices[0].message.content and plain.choices[0].finish_reason in ("stop", "length")
    chunks = list(
        client.chat.completions.create(
            model="demo/echo",
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == plain.choices[0].message.content
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
