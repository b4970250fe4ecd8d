"""An upstream that keeps its stream open after its end-of-stream event (`data: [DONE]`, Anthropic's
`message_stop`), or sends more after it.

The gateway read on until the upstream closed the body: the client's stream ended only when the read timeout
ran out (`first_byte_ms`, 120 s by default), holding the request's slot and connection all the while, and
events sent after the end were relayed as part of the answer. The end-of-stream event now ends the answer:
nothing after it is read, the client's stream ends at once, and the connection is closed unless the rest of
its body comes at once (tests/e2e/test_h1_settle.py).

Over real sockets: the gateway served by uvicorn, one aiohttp loopback upstream replaying recorded streams.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from tests.helpers.clients import sse_data
from tests.helpers.recordings import fixture_bytes
from tests.helpers.servers import GatewayThread, serve_config
from tests.helpers.upstreams import Upstream, reply_sse

CONFIG = """
server: {{host: 127.0.0.1, port: 0}}
retries: {{attempts: 1}}
providers:
  oa: {{kind: openai, api_key: sk-test-000000000000, base_url: "{u}/v1"}}
  an: {{kind: anthropic, api_key: sk-ant-test-0000000000, base_url: "{u}"}}
"""

AFTER = b'data: {"id":"x","object":"text_completion","created":1,"model":"m","choices":[{"text":" AFTER","index":0}]}'
CHAT_AFTER = (
    b'data: {"id":"x","object":"chat.completion.chunk","created":1,"model":"m",'
    b'"choices":[{"index":0,"delta":{"content":" AFTER"}}]}'
)


def completion_events() -> list[bytes]:
    choice = {"text": "hi", "index": 0, "logprobs": None, "finish_reason": "stop"}
    body = {"id": "x", "object": "text_completion", "created": 1, "model": "m", "choices": [choice]}
    return [b"data: " + json.dumps(body).encode(), b"data: [DONE]", AFTER]


def chat_events() -> list[bytes]:
    choice = {"index": 0, "delta": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
    body = {"id": "x", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [choice]}
    return [b"data: " + json.dumps(body).encode(), b"data: [DONE]", CHAT_AFTER]


def anthropic_events() -> list[bytes]:
    recorded = fixture_bytes("anthropic/messages_stream.sse.txt").replace(b"\r\n", b"\n").strip(b"\n").split(b"\n\n")
    delta = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": " AFTER"}}
    return [*recorded, b"event: content_block_delta\ndata: " + json.dumps(delta).encode()]


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    with Upstream() as server:
        yield server


@pytest.fixture(scope="module")
def gateway(upstream: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayThread]:
    with serve_config(tmp_path_factory.mktemp("stream-end"), CONFIG.format(u=upstream.url)) as gw:
        yield gw


# Per case: the path, the model, the request's own fields, and the upstream's events.
CASES: dict[str, tuple[str, str, dict[str, Any], Callable[[], list[bytes]]]] = {
    "completions": ("/v1/completions", "oa/m", {"prompt": "p"}, completion_events),
    "chat": ("/v1/chat/completions", "oa/m", {"messages": [{"role": "user", "content": "p"}]}, chat_events),
    "anthropic-chat": (
        "/v1/chat/completions",
        "an/claude",
        {"messages": [{"role": "user", "content": "p"}], "max_tokens": 16},
        anthropic_events,
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_end_of_stream_event_ends_the_clients_stream_at_once(
    gateway: GatewayThread, upstream: Upstream, case: str
) -> None:
    path, model, extra, events = CASES[case]
    upstream.handler = reply_sse(events(), hold_s=5)  # open well past the test's bound
    started = time.monotonic()
    with httpx.Client(base_url=gateway.url, trust_env=False, timeout=15) as client:
        resp = client.post(path, json={"model": model, "stream": True, **extra})
    assert time.monotonic() - started < 3  # not the read timeout (first_byte_ms, 120 s here)
    assert resp.status_code == 200, resp.text
    data = sse_data(resp.text)
    assert data[-1] == "[DONE]"
    assert "AFTER" not in resp.text and "error" not in resp.text
    texts = [json.loads(d)["choices"][0] for d in data[:-1] if json.loads(d)["choices"]]
    said = "".join(c.get("text") or (c.get("delta") or {}).get("content") or "" for c in texts)
    assert said == ("2" if case == "anthropic-chat" else "hi")
