"""A request waiting for an identical one in flight counts against its key's limits as the request it may yet
have to make would: it holds one of the key's `concurrent` slots while it waits, so a tenant cannot pile up
waiting requests past its limit (each past it is a 429 at once); and it waits only on its own tenant's
identical request, never receiving another key's answer (`scope: key`)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web

from tests.helpers.redis import RedisServer
from tests.helpers.servers import GatewayThread, serve_config
from tests.helpers.upstreams import Received, Upstream
from tests.helpers.waiting import wait_until

from .conftest import ALICE, BOB, MODEL, config

CAROL = "gk-cache-carol-concurrent-5e1d"


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


def _gated(upstream: Upstream) -> threading.Event:
    """The upstream holds every answer until the returned event is set."""
    gate = threading.Event()
    like = upstream.handler

    async def held(request: web.Request, received: Received) -> web.StreamResponse:
        while not gate.is_set():
            await asyncio.sleep(0.02)
        return await like(request, received)

    upstream.handler = held
    return gate


def _statuses(futures: list[Any]) -> list[int]:
    return sorted(f.result().status_code for f in futures if f.done())


@pytest.mark.parametrize("limiter", ["local", "redis"])
@pytest.mark.parametrize("stream", [False, True], ids=["buffered", "streamed"])
def test_requests_waiting_on_an_identical_one_hold_the_keys_concurrent_slots(
    upstream: Upstream, tmp_path: Path, request: pytest.FixtureRequest, limiter: str, stream: bool
) -> None:
    extra = ""
    if limiter == "redis":
        extra = f"redis: {{url: '{request.getfixturevalue('redis_server').url}'}}"
        request.getfixturevalue("redis_server").client().flushall()
    text = config(upstream, extra).replace(
        "keys:\n", f'keys:\n  - {{name: carol, key: "{CAROL}", limits: {{concurrent: 2}}}}\n', 1
    )
    gate = _gated(upstream)
    payload = {"model": MODEL, "prompt": f"waiters: {limiter} {stream}", "max_tokens": 5, "temperature": 0}
    payload["stream"] = stream
    headers = {"authorization": f"Bearer {CAROL}"}
    with serve_config(tmp_path, text) as gw, httpx.Client(base_url=gw.url, timeout=30, trust_env=False) as c:
        with ThreadPoolExecutor(8) as pool:
            try:
                leader = pool.submit(c.post, "/v1/completions", json=payload, headers=headers)
                wait_until(lambda: len(upstream.received) == 1, timeout=10)
                waiters = [pool.submit(c.post, "/v1/completions", json=payload, headers=headers) for _ in range(6)]
                # The leader holds one slot and the first waiter the other: the five others are refused at once,
                # while the leader's answer is still held upstream.
                wait_until(lambda: len(_statuses(waiters)) == 5, timeout=10)
                assert _statuses(waiters) == [429] * 5
                assert not leader.done()
            finally:
                gate.set()
            answers = [leader.result(timeout=30), *(w.result(timeout=30) for w in waiters)]
    served = [a for a in answers if a.status_code == 200]
    assert sorted(a.headers["x-gateway-cache"] for a in served) == ["coalesced", "miss"]
    refused = next(a for a in answers if a.status_code == 429)
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert len(upstream.received) == 1


def test_a_waiter_gives_its_slot_back_whether_answered_or_out_of_time(upstream: Upstream, tmp_path: Path) -> None:
    # With `concurrent: 2`, a leader and one waiter run side by side. A waiter past its own deadline (504) and one
    # answered by its leader (coalesced) each give their slot back: then two new requests run side by side again.
    text = config(upstream).replace(
        "keys:\n", f'keys:\n  - {{name: carol, key: "{CAROL}", limits: {{concurrent: 2, tpm: 100000}}}}\n', 1
    )
    payload = {"model": MODEL, "prompt": "waiters: slots back", "max_tokens": 5, "temperature": 0}
    headers = {"authorization": f"Bearer {CAROL}"}
    with serve_config(tmp_path, text) as gw, httpx.Client(base_url=gw.url, timeout=30, trust_env=False) as c:

        def post(body: dict[str, Any]) -> httpx.Response:
            return c.post("/v1/completions", json=body, headers=headers)

        with ThreadPoolExecutor(2) as pool:
            gate = _gated(upstream)
            leader = pool.submit(post, payload)
            wait_until(lambda: len(upstream.received) == 1, timeout=10)
            hasty = post(payload | {"inference_timeout": 0.5})
            assert hasty.status_code == 504, hasty.text
            waiter = pool.submit(post, payload)
            wait_until(lambda: _waiting(gw), timeout=10)
            gate.set()
            served = [f.result(timeout=30) for f in (leader, waiter)]
            assert [a.status_code for a in served] == [200, 200], served[1].text  # the 504's slot is free again
            assert sorted(a.headers["x-gateway-cache"] for a in served) == ["coalesced", "miss"]
            gate = _gated(upstream)
            both = [pool.submit(post, payload | {"prompt": f"waiters: next {i}"}) for i in range(2)]
            try:
                # Both are admitted and reach the upstream together: no slot was left taken.
                wait_until(lambda: len(upstream.received) == 3 or any(f.done() for f in both), timeout=10)
            finally:
                gate.set()
            assert [f.result(timeout=30).status_code for f in both] == [200, 200]
            assert len(upstream.received) == 3


def _waiting(gw: GatewayThread, count: int = 1) -> bool:
    """Whether `count` requests in flight have a request waiting for their answer."""
    cache = gw.pipeline.cache
    assert cache is not None
    return sum(lookup.waiter is not None for lookup in list(cache.inflight.values())) >= count


def test_a_waiter_never_receives_another_tenants_answer(upstream: Upstream, tmp_path: Path) -> None:
    # Each upstream call answers with text of its own: whoever got an answer can be told by it.
    calls: list[str] = []

    async def numbered(request: web.Request, received: Received) -> web.StreamResponse:
        calls.append(request.headers.get("authorization", ""))
        n = len(calls)
        while not gate.is_set():
            await asyncio.sleep(0.02)
        body = {
            "id": f"cmpl-{n}",
            "object": "text_completion",
            "created": 1,
            "model": MODEL.partition("/")[2],
            "choices": [{"index": 0, "text": f"answer {n}", "logprobs": None, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
        }
        return web.json_response(body)

    gate = threading.Event()
    upstream.handler = numbered
    payload = {"model": MODEL, "prompt": "waiters: tenants", "max_tokens": 5, "temperature": 0}
    with (
        serve_config(tmp_path, config(upstream)) as gw,
        httpx.Client(base_url=gw.url, timeout=30, trust_env=False) as c,
    ):

        def post(key: str) -> httpx.Response:
            return c.post("/v1/completions", json=payload, headers={"authorization": f"Bearer {key}"})

        with ThreadPoolExecutor(4) as pool:
            alice = pool.submit(post, ALICE)
            wait_until(lambda: len(calls) == 1, timeout=10)
            alice_again = pool.submit(post, ALICE)
            wait_until(lambda: _waiting(gw), timeout=10)
            bob = pool.submit(post, BOB)
            wait_until(lambda: len(calls) == 2, timeout=10)  # Bob's identical request asks for itself
            bob_again = pool.submit(post, BOB)
            wait_until(lambda: _waiting(gw, 2), timeout=10)
            gate.set()
            futures = {"a": alice, "a2": alice_again, "b": bob, "b2": bob_again}
            answers = {name: f.result(timeout=30) for name, f in futures.items()}
    text = {name: a.json()["choices"][0]["text"] for name, a in answers.items()}
    assert text == {"a": "answer 1", "a2": "answer 1", "b": "answer 2", "b2": "answer 2"}
    assert [answers[n].headers["x-gateway-cache"] for n in ("a", "a2", "b", "b2")] == ["miss", "coalesced"] * 2


def test_a_waiter_queued_for_its_slot_gets_the_answer_that_came_meanwhile(upstream: Upstream, tmp_path: Path) -> None:
    # `concurrent: 1` with a queue: the waiter waits for the leader's slot before it waits for the leader's
    # answer. The answer comes, and the slot frees, while it is queued: it is served that answer at once.
    text = config(upstream).replace(
        "keys:\n", f'keys:\n  - {{name: carol, key: "{CAROL}", limits: {{concurrent: 1, max_queue_ms: 8000}}}}\n', 1
    )
    gate = _gated(upstream)
    payload = {"model": MODEL, "prompt": "waiters: queued", "max_tokens": 5, "temperature": 0, "inference_timeout": 6}
    headers = {"authorization": f"Bearer {CAROL}"}
    with serve_config(tmp_path, text) as gw, httpx.Client(base_url=gw.url, timeout=30, trust_env=False) as c:
        with ThreadPoolExecutor(2) as pool:
            leader = pool.submit(c.post, "/v1/completions", json=payload, headers=headers)
            wait_until(lambda: len(upstream.received) == 1, timeout=10)
            waiter = pool.submit(c.post, "/v1/completions", json=payload, headers=headers)
            wait_until(lambda: _waiting(gw), timeout=10)  # it is queued for the slot, bound to wait after
            gate.set()
            first, second = leader.result(timeout=30), waiter.result(timeout=30)
    assert first.status_code == 200 and first.headers["x-gateway-cache"] == "miss"
    assert second.status_code == 200, second.text
    assert second.headers["x-gateway-cache"] == "coalesced"
    assert second.json()["choices"] == first.json()["choices"]
    assert len(upstream.received) == 1
