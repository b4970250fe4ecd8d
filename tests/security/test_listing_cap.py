"""A model listing is read only up to its own cap, derived from `discovery.max_models`.

The gateway (uvicorn in a thread) asks a loopback vLLM-like upstream for its models in the background.
The upstream streams a valid listing of far more ids than `discovery.max_models` could keep, chunked (no
Content-Length), and counts the bytes it managed to write. The transport must stop reading at the
listing's cap (max_models x 1 KiB + 64 KiB), not at `caps.upstream_body_bytes` (64 MiB), and nothing of
it is decoded: the provider's listing fails, once, naming the cap.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from aiohttp import web

from gateway.edge.discovery import LISTING_BYTES_PER_MODEL, LISTING_SLACK_BYTES
from tests.helpers.servers import GatewayThread
from tests.helpers.upstreams import Received, Upstream, reply
from tests.helpers.waiting import wait_until

MAX_MODELS = 100
CAP = MAX_MODELS * LISTING_BYTES_PER_MODEL + LISTING_SLACK_BYTES
# Under caps.upstream_body_bytes (64 MiB), far over the listing's cap, and twice what loopback sockets' buffers
# were seen to take in (about 13 MB) before the upstream learns the gateway hung up.
TOTAL = 48 * 1024 * 1024
CHUNK = 64 * 1024


class Streamed:
    """A listing of TOTAL bytes of small cards, written chunk by chunk; `sent` counts what got out."""

    def __init__(self) -> None:
        self.sent = 0
        self.done = threading.Event()

    async def __call__(self, request: web.Request, received: Received) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"content-type": "application/json"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        try:
            await resp.write(b'{"object":"list","data":[')
            i = 0
            while self.sent < TOTAL:
                cards = b",".join(b'{"id":"m-%08d","object":"model"}' % (i + j) for j in range(CHUNK // 32))
                i += CHUNK // 32
                await resp.write((b"," if self.sent else b"") + cards)
                self.sent += len(cards)
            await resp.write(b"]}")
            await resp.write_eof()
        except (ConnectionError, OSError):
            pass  # the gateway hung up: what it read is counted
        finally:
            self.done.set()
        return resp


def listed(gw: GatewayThread) -> list[str]:
    resp = httpx.get(gw.url + "/v1/models", trust_env=False, timeout=5)
    assert resp.status_code == 200, resp.text
    return [m["id"] for m in resp.json()["data"]]


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    with Upstream() as server:
        yield server


def test_a_listing_past_its_cap_is_not_read_on_nor_decoded(
    upstream: Upstream, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gateway")
    streamed = Streamed()
    upstream.listings = streamed
    config = tmp_path / "config.yaml"
    config.write_text(
        f"discovery: {{max_models: {MAX_MODELS}, ttl_ms: 60000}}\n"
        f"providers:\n  vl: {{kind: vllm, base_url: {upstream.url}/v1}}\n"
    )
    with GatewayThread(config, {}) as gw:
        wait_until(streamed.done.is_set, timeout=20)
        wait_until(lambda: any("'vl' failed" in r.getMessage() for r in caplog.records), timeout=10)
        failed = [r.getMessage() for r in caplog.records if "'vl' failed" in r.getMessage()]
        assert len(failed) == 1, failed
        assert f"larger than {CAP} bytes (discovery.max_models" in failed[0]
        # Read up to the cap plus what the sockets' buffers held when the gateway hung up, not the whole listing.
        assert streamed.sent < TOTAL // 2, streamed.sent
        assert not any(m.startswith("vl/") for m in listed(gw))


def test_a_listing_within_its_cap_is_listed(upstream: Upstream, tmp_path: Path) -> None:
    cards = b",".join(b'{"id":"m-%03d","object":"model","owned_by":"vllm"}' % i for i in range(MAX_MODELS))
    upstream.listings = reply(b'{"object":"list","data":[' + cards + b"]}")
    config = tmp_path / "config.yaml"
    config.write_text(
        f"discovery: {{max_models: {MAX_MODELS}}}\nproviders:\n  vl: {{kind: vllm, base_url: {upstream.url}/v1}}\n"
    )
    with GatewayThread(config, {}) as gw:
        wait_until(lambda: len(listed(gw)) == MAX_MODELS, timeout=10)
        assert listed(gw)[:2] == ["vl/m-000", "vl/m-001"]
