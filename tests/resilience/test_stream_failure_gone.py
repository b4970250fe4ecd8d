"""A stream that failed, then lost its client, is booked as the failure it was, once.

docs/observability.md: a failure is logged and counted once, with its cause, whether it happened before
or during a stream. Here the upstream fails mid-stream (an error event after a first chunk) and the client
leaves while the gateway is still handing it the error event: the failure came first, so the access log
and `gateway_requests_total` keep its status, not the 499 of a client that left a healthy stream.

Real sockets throughout: the gateway under uvicorn, a raw-socket client that reads nothing (its window
is tiny, so the gateway's writes stall on flow control while it relays the error event), and a scripted
loopback upstream.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from aiohttp import web

from tests.e2e.test_observability import metric
from tests.helpers.accesslog import listening
from tests.helpers.faults import CHUNKS, DONE_EVENT, FaultServer, Hit, openai_error
from tests.helpers.servers import serve_config
from tests.helpers.waiting import wait_until

# Large events, sent until the gateway's socket and write buffer are full: its next send (the error
# event) then waits for a client that never reads.
_FIRST = json.loads(CHUNKS[0][len(b"data: ") :])
_FIRST["choices"][0]["text"] = "x" * 500_000
BIG_CHUNK = b"data: " + json.dumps(_FIRST).encode()
ERROR_EVENT = b"data: " + openai_error("The server had an error while processing your request.", "server_error", None)


def test_a_client_gone_after_a_mid_stream_failure_keeps_the_failure(faults: FaultServer, tmp_path: Path) -> None:
    written = threading.Event()
    connections: set[Any] = set()

    def paused() -> bool:
        return any(conn.write_paused for conn in connections)

    async def big_chunk_then_error(request: web.Request, hit: Hit) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        while not paused():  # each relayed before the next is sent: the last one fills the gateway's buffer
            await resp.write(BIG_CHUNK + b"\n\n")
            await asyncio.sleep(0.1)
        for event in (ERROR_EVENT, DONE_EVENT):
            await resp.write(event + b"\n\n")
        await resp.write_eof()
        written.set()
        return resp

    config = (
        "timeouts: {first_byte_ms: 60000, total_ms: 600000}\n"
        f"providers:\n  up: {{kind: openai, api_key: sk-up, base_url: '{faults['up'].base_url}'}}\n"
    )
    faults["up"].script(big_chunk_then_error)
    with listening() as access, serve_config(tmp_path, config) as gw:
        connections = gw.server.server_state.connections  # read only: whether the client's writes stalled
        client = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connecting: the window offered
        client.connect(("127.0.0.1", gw.port))
        body = b'{"model": "up/davinci-002", "prompt": "Say this is a test", "max_tokens": 7, "stream": true}'
        client.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        # The upstream sent its error event; the gateway reads it and waits to send it to a client that
        # reads nothing.
        wait_until(written.is_set, timeout=10)
        time.sleep(0.3)
        assert not access.lines
        # The client leaves (a reset: what it never read is dropped).
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.close()
        wait_until(lambda: len(access.lines) == 1, timeout=10)
        with httpx.Client(trust_env=False, timeout=10) as c:
            text = c.get(gw.url + "/metrics").text
    line = access.lines[0]
    assert line["status"] == 502, line
    assert line["error"] == "server_error", line
    assert line["cause"] == "http_500", line
    assert metric(text, "gateway_requests_total", status="502") == 1
    assert metric(text, "gateway_requests_total", status="499") == 0
    assert metric(text, "gateway_upstream_failures_total", provider="up") == 1
