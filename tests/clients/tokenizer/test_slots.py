"""A tokenizer call holds a slot of its server's `max_concurrency` while it runs, as a completion's attempt does,
and a client that leaves cancels it upstream. Real sockets: the gateway under uvicorn, a loopback vLLM."""

from __future__ import annotations

import asyncio
import http.client
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from aiohttp import web

from tests.clients.tokenizer.upstreams import AUTH, BASE, BOS
from tests.helpers.recordings import fixture_bytes
from tests.helpers.servers import GatewayThread, serve_config
from tests.helpers.upstreams import Received, Upstream, hang
from tests.helpers.waiting import wait_until


def test_a_client_that_leaves_cancels_the_upstream_tokenizer_call(gateway: GatewayThread, upstream: Upstream) -> None:
    cancelled = threading.Event()
    upstream.handler = hang(cancelled, seconds=30)
    body = b'{"tokens": [1, 72, 105]}'
    conn = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=15)
    try:
        conn.request("POST", f"{BASE}/detokenize", body=body, headers={**AUTH, "content-type": "application/json"})
        wait_until(lambda: len(upstream.received) == 1)
    finally:
        conn.close()  # the client gives up before any answer
    # The gateway lets go of its upstream request at once, not when the upstream's timeout ends it.
    assert cancelled.wait(5), "the upstream call outlived its client"


CAPPED = """
server: {{host: 127.0.0.1, port: 0}}
retries: {{attempts: 1}}
providers:
  vl: {{kind: vllm, base_url: {u}/vl/v1, max_concurrency: 1}}
"""
MODEL = "vl/facebook/opt-125m"


@pytest.fixture
def capped(upstream_server: Upstream, tmp_path: Path) -> Iterator[tuple[GatewayThread, Upstream, threading.Event]]:
    release = threading.Event()

    async def handler(request: web.Request, rec: Received) -> web.StreamResponse:
        if rec.path == "/vl/tokenize":
            while not release.is_set():  # the first call holds the server's one slot until the test lets go
                await asyncio.sleep(0.01)
            return web.json_response({"count": 2, "max_model_len": 2048, "tokens": [BOS, 120], "token_strs": None})
        return web.Response(body=fixture_bytes("vllm/completion_opt125m.json"), content_type="application/json")

    upstream_server.reset()
    upstream_server.handler = handler
    with serve_config(tmp_path, CAPPED.format(u=upstream_server.url)) as gw:
        try:
            yield gw, upstream_server, release
        finally:
            release.set()
            upstream_server.reset()


def test_a_tokenizer_call_holds_a_slot_of_its_servers_max_concurrency(
    capped: tuple[GatewayThread, Upstream, threading.Event],
) -> None:
    gw, upstream, release = capped
    with httpx.Client(base_url=gw.url, trust_env=False, timeout=15) as api, ThreadPoolExecutor(2) as pool:
        tokenizing = pool.submit(api.post, f"/m/{MODEL}/tokenize", json={"prompt": "x"})
        wait_until(lambda: len(upstream.received) == 1)
        completing = pool.submit(api.post, "/v1/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 5})
        time.sleep(0.3)
        # The server's one slot is the tokenizer call's: the completion waits in the queue, not upstream.
        assert [r.path for r in upstream.received] == ["/vl/tokenize"]
        assert not completing.done()
        release.set()
        assert tokenizing.result().status_code == 200, tokenizing.result().text
        done = completing.result()
        assert done.status_code == 200, done.text
    assert [r.path for r in upstream.received] == ["/vl/tokenize", "/vl/v1/completions"]


ELSEWHERE = """
server: {{host: 127.0.0.1, port: 0}}
retries: {{attempts: 1}}
providers:
  far: {{kind: vllm, base_url: {u}/far/v1, max_concurrency: 1, tokenizer_url: {t}/tok}}
  near: {{kind: vllm, base_url: {u}/near/v1, max_concurrency: 1, tokenizer_url: {u}/neartok}}
"""


@pytest.fixture
def split(
    upstream_server: Upstream, tmp_path: Path
) -> Iterator[tuple[GatewayThread, Upstream, Upstream, threading.Event]]:
    """`far`'s tokenizer routes on another server than its base_url, `near`'s on the same one (another path);
    a completion holds its server's one slot until the test lets go."""
    release = threading.Event()

    async def handler(request: web.Request, rec: Received) -> web.StreamResponse:
        if rec.path.endswith("/tokenize"):
            return web.json_response({"count": 2, "max_model_len": 2048, "tokens": [BOS, 120], "token_strs": None})
        while not release.is_set():
            await asyncio.sleep(0.01)
        return web.Response(body=fixture_bytes("vllm/completion_opt125m.json"), content_type="application/json")

    upstream_server.reset()
    upstream_server.handler = handler
    with Upstream() as tokenizers:
        tokenizers.handler = handler
        config = ELSEWHERE.format(u=upstream_server.url, t=tokenizers.url)
        with serve_config(tmp_path, config) as gw:
            try:
                yield gw, upstream_server, tokenizers, release
            finally:
                release.set()
                upstream_server.reset()


def test_a_tokenizer_url_takes_the_slots_of_the_server_it_calls(
    split: tuple[GatewayThread, Upstream, Upstream, threading.Event],
) -> None:
    gw, upstream, tokenizers, release = split
    completion = {"prompt": "Hi", "max_tokens": 5}
    with httpx.Client(base_url=gw.url, trust_env=False, timeout=15) as api, ThreadPoolExecutor(4) as pool:
        held = [
            pool.submit(api.post, "/v1/completions", json={"model": f"{p}/facebook/opt-125m", **completion})
            for p in ("far", "near")
        ]
        wait_until(lambda: len(upstream.received) == 2)  # each base_url server's one slot is taken
        # Another server: its call waits for no slot of `far`'s base_url server.
        far = api.post("/m/far/facebook/opt-125m/tokenize", json={"prompt": "x"}, timeout=5)
        assert far.status_code == 200, far.text
        assert [r.path for r in tokenizers.received] == ["/tok/tokenize"]
        # The same server under another path: the call waits for its slot as a completion would.
        near = pool.submit(api.post, "/m/near/facebook/opt-125m/tokenize", json={"prompt": "x"})
        time.sleep(0.3)
        assert not near.done()
        assert not any(r.path == "/neartok/tokenize" for r in upstream.received)
        release.set()
        assert near.result().status_code == 200, near.result().text
        assert all(h.result().status_code == 200 for h in held)
