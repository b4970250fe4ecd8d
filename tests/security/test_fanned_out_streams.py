"""Streams the gateway fans out, one upstream call per choice (`n` past a provider's `max_n`, or on a kind
that has no `n`), merged into the client's one stream.

Each call's usage is the last one it sent: an engine that repeats a running total on every chunk is counted
once per call, not once per chunk (which over-charged the key's limits and budget). Each call asked for one
choice: an event for another choice number is an invalid stream event, ended with an error event as on a
stream the gateway does not fan out, instead of being relabelled as the call's own choice and mixed into it.

Over real sockets: the gateway served by uvicorn, one aiohttp loopback upstream speaking OpenAI's wire format
(completions, and chat for a `deepseek` provider, whose chat has no `n`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from tests.helpers.clients import sse_data
from tests.helpers.servers import GatewayThread, serve_config
from tests.helpers.upstreams import Upstream, reply_sse

CONFIG = """
server: {{host: 127.0.0.1, port: 0}}
retries: {{attempts: 1}}
providers:
  one: {{kind: openai, api_key: sk-test-000000000000, base_url: "{u}/v1", max_n: 1}}
  ds: {{kind: deepseek, api_key: sk-test-000000000001, base_url: "{u}/v1"}}
"""


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    with Upstream() as server:
        yield server


@pytest.fixture(scope="module")
def gateway(upstream: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayThread]:
    with serve_config(tmp_path_factory.mktemp("fanned-out"), CONFIG.format(u=upstream.url)) as gw:
        yield gw


@pytest.fixture
def api(gateway: GatewayThread, upstream: Upstream) -> Iterator[httpx.Client]:
    gateway.pipeline.health.reset()
    upstream.received.clear()
    with httpx.Client(base_url=gateway.url, trust_env=False, timeout=15) as client:
        yield client


def usage(completion: int) -> dict[str, int]:
    return {"prompt_tokens": 3, "completion_tokens": completion, "total_tokens": 3 + completion}


def text_event(index: int, text: str, finish: str | None, used: dict[str, int] | None) -> bytes:
    choice = {"text": text, "index": index, "logprobs": None, "finish_reason": finish}
    body: dict[str, Any] = {"id": "x", "object": "text_completion", "created": 1, "model": "m", "choices": [choice]}
    if used is not None:
        body["usage"] = used
    return b"data: " + json.dumps(body).encode()


def chat_event(index: int, content: str | None, finish: str | None, used: dict[str, int] | None) -> bytes:
    delta = {} if content is None else {"role": "assistant", "content": content}
    choice = {"index": index, "delta": delta, "finish_reason": finish}
    body: dict[str, Any] = {"id": "x", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    body["choices"] = [choice]
    if used is not None:
        body["usage"] = used
    return b"data: " + json.dumps(body).encode()


# How an upstream event is made: (choice index, text, finish reason, usage) -> its SSE line.
MakeEvent = Callable[[int, str, str | None, dict[str, int] | None], bytes]
# Per route: the path, the model, the request's own fields, and its upstream events.
ROUTES: dict[str, tuple[str, str, dict[str, Any], MakeEvent]] = {
    "completions": ("/v1/completions", "one/m", {"prompt": "p"}, text_event),
    "chat": ("/v1/chat/completions", "ds/m", {"messages": [{"role": "user", "content": "p"}]}, chat_event),
}


def streamed(api: httpx.Client, route: str, n: int) -> tuple[dict[int, str], list[dict[str, Any]], list[str]]:
    """The client's stream: each choice's text, the usages it carried, the error codes of its error events."""
    path, model, extra, _ = ROUTES[route]
    body = {"model": model, "n": n, "stream": True, "stream_options": {"include_usage": True}, **extra}
    resp = api.post(path, json=body)
    assert resp.status_code == 200, resp.text
    texts: dict[int, str] = {}
    usages: list[dict[str, Any]] = []
    errors: list[str] = []
    for data in sse_data(resp.text):
        if data == "[DONE]":
            continue
        event = json.loads(data)
        if "error" in event:
            errors.append(event["error"]["code"])
            continue
        for c in event.get("choices") or ():
            piece = c["text"] if route == "completions" else (c["delta"].get("content") or "")
            texts[c["index"]] = texts.get(c["index"], "") + piece
        if event.get("usage"):
            usages.append(event["usage"])
    return texts, usages, errors


@pytest.mark.parametrize("route", list(ROUTES))
def test_a_running_usage_on_every_chunk_counts_once_per_call(api: httpx.Client, upstream: Upstream, route: str) -> None:
    make = ROUTES[route][3]
    upstream.handler = reply_sse(
        [
            make(0, "hi", None, usage(1)),
            make(0, " there", None, usage(2)),
            make(0, "", "stop", usage(2)),
            b"data: [DONE]",
        ]
    )
    texts, usages, errors = streamed(api, route, 1)
    assert (texts, usages, errors) == ({0: "hi there"}, [usage(2)], [])  # not fanned out: the last one
    texts, usages, errors = streamed(api, route, 2)
    assert len([r for r in upstream.received if r.path.endswith("completions")]) == 3  # two calls for n: 2
    assert texts == {0: "hi there", 1: "hi there"} and errors == []
    assert usages == [{"prompt_tokens": 6, "completion_tokens": 4, "total_tokens": 10}]  # each call's last, summed


@pytest.mark.parametrize("other", [1, -1, 5])
@pytest.mark.parametrize("route", list(ROUTES))
def test_a_call_asked_for_one_choice_sending_another_ends_the_stream_with_an_error(
    api: httpx.Client, upstream: Upstream, route: str, other: int
) -> None:
    make = ROUTES[route][3]
    upstream.handler = reply_sse(
        [make(0, "mine", None, None), make(other, " FOREIGN", None, None), make(0, "", "stop", usage(1))]
    )
    texts, _, errors = streamed(api, route, 2)
    assert errors == ["invalid_upstream_response"]
    assert not any("FOREIGN" in t for t in texts.values()), texts
