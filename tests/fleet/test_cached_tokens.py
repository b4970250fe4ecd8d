"""The response cache in front of a fleet: a streamed answer's token-native fields survive being served
buffered from the entry the stream stored."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
from aiohttp import web

from tests.helpers.servers import serve_config
from tests.helpers.upstreams import Received, Upstream

from .conftest import fleet_config


def _chunk(text: str, **choice: object) -> bytes:
    event = {"id": "c", "object": "text_completion", "created": 1, "model": "m"}
    event["choices"] = [{"index": 0, "text": text, "logprobs": None, "finish_reason": None, **choice}]
    return b"data: " + json.dumps(event).encode() + b"\n\n"


def test_a_cached_stream_served_buffered_keeps_every_token_id_and_the_stop_reason(
    tmp_path: Path, replicas: list[Upstream]
) -> None:
    async def streaming(request: web.Request, received: Received) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(_chunk("h", token_ids=[11], prompt_token_ids=[1, 2, 3]))
        await resp.write(_chunk("i", token_ids=[12, 13]))
        await resp.write(_chunk("", token_ids=[14], finish_reason="stop", stop_reason=42))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    for u in replicas:
        u.handler = streaming
    cache = "cache: {mode: always, scope: shared}\n"
    body = {"model": "engine/m", "prompt": "p", "return_token_ids": True, "include_stop_reason": True}
    with serve_config(tmp_path, fleet_config(replicas, "policy: prefix", extra=cache)) as gw:
        with httpx.Client(trust_env=False, timeout=15) as c:
            url = f"{gw.url}/v1/completions"
            with c.stream("POST", url, json=body | {"stream": True}) as s:
                assert s.headers["x-gateway-cache"] == "miss"
                assert "[DONE]" in "".join(s.iter_lines())
            r = c.post(url, json=body)
    assert r.status_code == 200 and r.headers["x-gateway-cache"] == "hit", r.text
    assert sum(len(u.received) for u in replicas) == 1
    choice = r.json()["choices"][0]
    assert choice["text"] == "hi" and choice["finish_reason"] == "stop"
    assert choice["token_ids"] == [11, 12, 13, 14]
    assert choice["prompt_token_ids"] == [1, 2, 3]
    assert choice["stop_reason"] == 42
