"""Several loopback engine replicas (real aiohttp servers) and a gateway in front of them."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from aiohttp import web

from tests.helpers.upstreams import Handler, Received, Upstream


def completion(text: str = "ok", **choice: object) -> bytes:
    return json.dumps(
        {
            "id": "cmpl-1",
            "object": "text_completion",
            "created": 1700000000,
            "model": "m",
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": "stop", **choice}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
        }
    ).encode()


def answering(body: bytes = completion()) -> Handler:
    async def handler(request: web.Request, received: Received) -> web.StreamResponse:
        return web.Response(body=body, content_type="application/json")

    return handler


@pytest.fixture
def replicas() -> Iterator[list[Upstream]]:
    ups = [Upstream() for _ in range(3)]
    for u in ups:
        u.start()
        u.handler = answering()
    try:
        yield ups
    finally:
        for u in ups:
            u.stop()


def served(ups: list[Upstream]) -> list[int]:
    """Completion calls per replica (engine-metrics reads left out)."""
    return [sum(1 for r in u.received if r.path.endswith("/completions")) for u in ups]


def fleet_config(
    ups: list[Upstream], routing: str, *, extra: str = "", replicas: str = "", prefix_scope: str = ""
) -> str:
    listed = replicas or ", ".join(f"{u.url}/v1" for u in ups)
    scope = f"\n    prefix_scope: {prefix_scope}" if prefix_scope else ""
    return f"""
server: {{host: 127.0.0.1, port: 0}}
timeouts: {{connect_ms: 2000, first_byte_ms: 10000, total_ms: 20000}}
retries: {{attempts: 3, initial_backoff_ms: 0, max_backoff_ms: 0}}
admin: {{key: admin-fleet-key}}
logging: {{requests: false}}
providers:
  engine:
    kind: vllm
    discover: false
    models: [m]
    replicas: [{listed}]
    routing: {{{routing}}}{scope}
{extra}"""
