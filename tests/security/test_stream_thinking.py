"""A model's thinking is progress for the idle caps, even where the route leaves it out, over real sockets.

On `/v1/completions` the Anthropic, Bedrock and Cohere kinds drop thinking deltas (no completion text), so
each looked like an ignored event: a model thinking for longer than `timeouts.stream_idle_ms`, or for more
bytes than `caps.upstream_idle_stream_bytes` (about 7,000 Anthropic deltas at the default 1 MiB), had its
stream ended as idle. Here an Anthropic-kind upstream (the recorded thinking stream's events) thinks for
twice the idle time, or four times the byte cap, then answers: the client gets the whole answer. Pings alone
for as long still end the stream, so the caps still hold.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import httpx
import pytest
from aiohttp import web

from tests.helpers.clients import sse_data
from tests.helpers.servers import serve_config
from tests.helpers.upstreams import Received, Upstream

IDLE_MS: Final = 1000
THINK_S: Final = 2.0  # twice the idle time
CAP: Final = 1024  # the smallest byte cap the config takes; the thinking sends four times as much
CAPS: Final = {"bytes": CAP, "time": 1024 * 1024}  # which cap the thinking outlasts first: each alone

CONFIG: Final = """
server: {{host: 127.0.0.1, port: 0}}
timeouts: {{connect_ms: 2000, first_byte_ms: 5000, total_ms: 20000, stream_idle_ms: {idle}}}
retries: {{attempts: 1, same_target: 0, initial_backoff_ms: 0, max_backoff_ms: 0}}
caps: {{upstream_idle_stream_bytes: {cap}}}
providers:
  claude: {{kind: anthropic, api_key: sk-ant, base_url: '{url}/claude', default_max_tokens: 64}}
"""


def _event(kind: str, **data: Any) -> bytes:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n".encode()


START: Final = _event(
    "message_start",
    message={
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-20250514",
        "content": [],
        "stop_reason": None,
        "usage": {"input_tokens": 43, "output_tokens": 1},
    },
)
THINKING: Final = _event("content_block_start", index=0, content_block={"type": "thinking", "thinking": ""})
THOUGHT: Final = _event("content_block_delta", index=0, delta={"type": "thinking_delta", "thinking": " and so"})
PING: Final = _event("ping")
ANSWER: Final = [
    _event("content_block_stop", index=0),
    _event("content_block_start", index=1, content_block={"type": "text", "text": ""}),
    _event("content_block_delta", index=1, delta={"type": "text_delta", "text": "Look both ways."}),
    _event("content_block_stop", index=1),
    _event("message_delta", delta={"stop_reason": "end_turn"}, usage={"output_tokens": 90}),
    _event("message_stop"),
]


def thinker(between: bytes) -> Any:
    """An upstream that sends `between` every 20 ms for `THINK_S`, then the answer."""

    async def handler(request: web.Request, received: Received) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(START + THINKING)
        began = time.monotonic()
        try:
            while time.monotonic() - began < THINK_S:
                await resp.write(between)
                await asyncio.sleep(0.02)
            for event in ANSWER:
                await resp.write(event)
        except ConnectionError:
            pass  # the gateway hung up: the stream was taken for idle
        return resp

    return handler


@pytest.fixture(scope="module")
def up() -> Iterator[Upstream]:
    with Upstream() as server:
        yield server


def _stream(tmp_path: Path, up: Upstream, between: bytes, cap: int = CAP) -> httpx.Response:
    up.reset()
    up.handler = thinker(between)
    body = {"model": "claude/claude-sonnet-4", "prompt": "How do I cross?", "max_tokens": 64, "stream": True}
    with (
        serve_config(tmp_path, CONFIG.format(idle=IDLE_MS, cap=cap, url=up.url)) as gw,
        httpx.Client(trust_env=False, timeout=30) as client,
    ):
        return client.post(gw.url + "/v1/completions", json=body)


@pytest.mark.parametrize("outlasts", list(CAPS))
def test_a_model_thinking_past_the_idle_caps_is_relayed_whole(tmp_path: Path, up: Upstream, outlasts: str) -> None:
    resp = _stream(tmp_path, up, THOUGHT, CAPS[outlasts])
    assert resp.status_code == 200, resp.text[:300]
    data = sse_data(resp.text)
    assert data[-1] == "[DONE]" and all("error" not in json.loads(d) for d in data[:-1]), data[-3:]
    assert "".join(c["text"] for d in data[:-1] for c in json.loads(d)["choices"]) == "Look both ways."
    assert len(THOUGHT) * THINK_S / 0.02 > 4 * CAP  # it did send more than the byte cap of thinking


@pytest.mark.parametrize("outlasts", list(CAPS))
def test_pings_for_as_long_still_end_it(tmp_path: Path, up: Upstream, outlasts: str) -> None:
    resp = _stream(tmp_path, up, PING, CAPS[outlasts])
    assert resp.status_code == 502, resp.text[:300]
    assert resp.json()["error"]["code"] == "upstream_stream_idle"
