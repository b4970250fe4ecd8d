"""The gateway itself, served by uvicorn, answering the official openai client through a provider on
`transport: httpx`, over real loopback sockets."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web

from gateway.upstream.httpx_transport import HttpxTransport
from tests.helpers.clients import openai_client
from tests.helpers.faults import CHUNKS, RECORDED_JSON, RECORDED_SSE, RECORDED_STREAM_TEXT
from tests.helpers.servers import GatewayThread
from tests.helpers.upstreams import Received
from tests.helpers.upstreams import Upstream as ThreadedUpstream

# --------------------------------------------------------------------------------------------------
# End to end: the gateway on uvicorn, the official client, a provider on httpx


@pytest.fixture
def e2e_upstream() -> Iterator[ThreadedUpstream]:
    with ThreadedUpstream() as server:
        yield server


def test_a_completion_and_a_stream_through_the_gateway_on_httpx(e2e_upstream: ThreadedUpstream, tmp_path: Path) -> None:
    async def handler(request: web.Request, received: Received) -> web.StreamResponse:
        body = json.loads(await request.read() or b"{}")
        if body.get("stream"):
            resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
            await resp.prepare(request)
            await resp.write(RECORDED_SSE)
            await resp.write_eof()
            return resp
        return web.Response(body=RECORDED_JSON, content_type="application/json")

    e2e_upstream.handler = handler
    config = tmp_path / "gw.yaml"
    config.write_text(
        "keys: [{name: t, key: gk-transport-e2e}]\n"
        "retries: {attempts: 1}\n"
        f"providers:\n  up: {{kind: openai, api_key: sk-up, base_url: '{e2e_upstream.url}/v1', transport: httpx}}\n"
    )
    gw = GatewayThread(config, {})
    gw.start()
    try:
        assert isinstance(gw.pipeline.upstream.transport("up"), HttpxTransport)
        client = openai_client(gw.url + "/v1", "gk-transport-e2e")
        done = client.completions.create(model="up/davinci-002", prompt="Say hello", max_tokens=16)
        assert done.choices[0].text == json.loads(RECORDED_JSON)["choices"][0]["text"]
        texts = [
            c.choices[0].text
            for c in client.completions.create(model="up/davinci-002", prompt="Say hello", max_tokens=16, stream=True)
            if c.choices
        ]
        assert "".join(texts) == RECORDED_STREAM_TEXT and len(texts) == len(CHUNKS)
        assert [r.headers["authorization"] for r in e2e_upstream.received] == ["Bearer sk-up"] * 2
    finally:
        gw.stop()
