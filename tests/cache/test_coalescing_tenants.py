"""Coalescing never makes one tenant wait on another's client: a leader whose client stopped reading (a raw
socket that never reads) no longer holds another tenant's identical request, which asks the upstream itself
within its alias's own timeout."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.helpers.servers import GatewayThread, serve_config
from tests.helpers.upstreams import Upstream

from .conftest import ALICE, BOB, MODEL, config
from .test_memory_held import streaming

# The global `total_ms` of the config is 20 s; this alias's is 10 s. A request that waited on the stalled
# leader until its deadline would take 10 s; one that stops waiting after `inflight.PATIENCE_S` (1 s) and asks
# itself takes well under 6 s, even on a loaded machine (about 8 MB relayed).
ALIAS = f"""models:
  - name: shared-10s
    targets: [{{model: {MODEL}}}]
    timeouts: {{connect_ms: 1000, first_byte_ms: 10000, total_ms: 10000}}
    cache: {{mode: always, scope: shared, max_entry_bytes: 67108864}}
"""


@pytest.fixture
def gateway10s(upstream: Upstream, tmp_path: Path) -> Iterator[GatewayThread]:
    text = config(upstream, "logging: {requests: false}").replace("models:\n", ALIAS, 1)
    with serve_config(tmp_path, text) as gw:
        yield gw


def _stalled_leader(url: str, payload: dict[str, object]) -> socket.socket:
    """A client that sends its request and never reads a byte of the answer (its receive buffer kept small)."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, int(port)))
    body = json.dumps(payload).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nhost: {host}\r\nauthorization: Bearer {ALICE}\r\n"
        f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
    )
    sock.sendall(head.encode() + body)
    return sock


def test_a_leader_whose_client_stopped_reading_does_not_hold_another_tenant(
    gateway10s: GatewayThread, upstream: Upstream
) -> None:
    # About 8 MB of stream: more than the sockets between the gateway and the stalled client can take in.
    upstream.handler = streaming(2_000, 4_000)
    payload = {
        "model": "shared-10s",
        "prompt": "tenants: stalled",
        "max_tokens": 2_000,
        "temperature": 0,
        "stream": True,
    }
    leader = _stalled_leader(gateway10s.url, payload)
    try:
        deadline = time.monotonic() + 5
        while not upstream.received and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(upstream.received) == 1
        time.sleep(0.5)  # its relay fills the sockets and blocks on its client
        started = time.monotonic()
        got = 0
        with httpx.Client(base_url=gateway10s.url, timeout=20, trust_env=False) as bob:
            headers = {"authorization": f"Bearer {BOB}"}
            with bob.stream("POST", "/v1/completions", json=payload, headers=headers) as resp:
                assert resp.status_code == 200
                state = resp.headers["x-gateway-cache"]
                text = b"".join(resp.iter_raw())
                got = len(text)
        elapsed = time.monotonic() - started
        # Bob's answer came whole, from the upstream he asked himself, long before his alias's 10 s.
        assert elapsed < 6.0, elapsed
        assert state == "miss"
        assert got > 8_000_000 and text.endswith(b"data: [DONE]\n\n")
        assert len(upstream.received) == 2
    finally:
        leader.close()


def test_the_requests_that_waited_on_a_stalled_leader_follow_the_one_that_asks_in_its_place(
    gateway10s: GatewayThread, upstream: Upstream
) -> None:
    upstream.handler = streaming(2_000, 4_000)
    payload = {"model": "shared-10s", "prompt": "tenants: takeover", "max_tokens": 2_000, "temperature": 0}
    payload["stream"] = True
    leader = _stalled_leader(gateway10s.url, payload)
    try:
        deadline = time.monotonic() + 5
        while not upstream.received and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.5)

        async def three() -> list[tuple[int, str, bytes]]:
            headers = {"authorization": f"Bearer {BOB}"}
            async with httpx.AsyncClient(base_url=gateway10s.url, headers=headers, timeout=20, trust_env=False) as c:

                async def one() -> tuple[int, str, bytes]:
                    async with c.stream("POST", "/v1/completions", json=payload) as resp:
                        text = b"".join([raw async for raw in resp.aiter_raw()])
                        return resp.status_code, resp.headers.get("x-gateway-cache", ""), text

                return await asyncio.gather(*(one() for _ in range(3)))

        started = time.monotonic()
        answers = asyncio.run(three())
        assert time.monotonic() - started < 6.0
        assert [status for status, _, _ in answers] == [200] * 3, answers[0][2][:300]
        assert sorted(state for _, state, _ in answers) == ["coalesced", "coalesced", "miss"]
        texts = [
            [
                c["text"]
                for line in t.split(b"\n\n")
                if line.startswith(b"data: {")
                for c in json.loads(line[6:])["choices"]
            ]
            for _, _, t in answers
        ]
        assert texts[0] == texts[1] == texts[2] and len(texts[0]) == 2_000
        assert len(upstream.received) == 2  # the stalled leader's call, and the one that asked in its place
    finally:
        leader.close()
