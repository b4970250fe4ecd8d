"""A client that leaves the moment its stream's response starts gives back everything the stream held.

The window: the upstream's first event completes the attempt (the response is about to start) while the
client's disconnect is already on its way. Whether the gateway sees the disconnect before or after it
starts the relay, the request's concurrency lease (Redis), its target's in-flight count and the upstream
connection must all be released, at once, not when the upstream's stream would have ended (here: never).

Real sockets throughout: the gateway under uvicorn, a raw-socket client, a scripted loopback upstream
and a real redis-server. The upstream closes the client's socket itself right after writing the first
event, so both arrive at the gateway together, every time.
"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import httpx
from aiohttp import web

from tests.helpers.faults import CHUNKS, FaultServer, Hit
from tests.helpers.identity import bucket
from tests.helpers.redis import RedisServer
from tests.helpers.servers import serve_config
from tests.helpers.waiting import wait_until

KEY = bucket("k-one", "concurrent")
REPEATS = 12


def request(sock: socket.socket) -> None:
    body = b'{"model": "up/davinci-002", "prompt": "Say this is a test", "max_tokens": 7, "stream": true}'
    sock.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer k-one\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    )


def live_leases(rds: RedisServer) -> list[str]:
    with rds.client() as r:
        sec, usec = r.time()
        now = int(sec) * 1000 + int(usec) // 1000
        return [str(m) for m in r.zrangebyscore(KEY, f"({now}", "+inf")]


def test_a_client_gone_as_its_stream_starts_holds_nothing(
    rds: RedisServer, faults: FaultServer, tmp_path: Path
) -> None:
    clients: list[socket.socket] = []

    async def first_event_then_client_leaves(request: web.Request, hit: Hit) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(CHUNKS[0] + b"\n\n")
        clients[-1].close()  # the client leaves as the first event leaves here: both reach the gateway together
        await asyncio.sleep(3600)  # and the upstream never ends the stream on its own
        return resp

    config = (
        f"redis: {{url: '{rds.url}'}}\n"
        "timeouts: {first_byte_ms: 60000, total_ms: 600000}\n"
        "keys:\n  - {name: one, key: k-one, limits: {concurrent: 1}}\n"
        f"providers:\n  up: {{kind: openai, api_key: sk-up, base_url: '{faults['up'].base_url}'}}\n"
    )
    with serve_config(tmp_path, config) as gw:
        target = faults["up"]
        for i in range(REPEATS):
            target.script(first_event_then_client_leaves)
            clients.append(socket.create_connection(("127.0.0.1", gw.port), timeout=10))
            request(clients[-1])  # the upstream closes it
            # The upstream connection is closed by the gateway (not left open, nor pooled half-read) ...
            wait_until(lambda n=i + 1: target.count == n and target.hits[-1].disconnected.is_set(), timeout=10)
            # ... and the request's lease and the target's in-flight count are back to nothing, before the
            # next request (with one concurrent request allowed) arrives.
            wait_until(lambda: not live_leases(rds), timeout=10)
            wait_until(lambda: not gw.pipeline.health.local.inflight, timeout=10)
        assert target.count == REPEATS
        # The key's one slot is free: a whole stream goes through.
        with httpx.Client(trust_env=False, timeout=30) as c:
            body = {"model": "up/davinci-002", "prompt": "Say this is a test", "max_tokens": 7, "stream": True}
            r = c.post(gw.url + "/v1/completions", json=body, headers={"authorization": "Bearer k-one"})
            assert r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]")
        assert not live_leases(rds) and not gw.pipeline.health.local.inflight
