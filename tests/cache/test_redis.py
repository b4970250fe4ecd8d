"""The Redis store: a real `redis-server` shared by two gateway processes."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from tests.helpers.redis import RedisServer
from tests.helpers.servers import GatewayProcess
from tests.helpers.upstreams import Upstream

from .conftest import ADMIN, ALICE, BOB, MODEL, client, config


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture
def pair(procs: list[GatewayProcess]) -> tuple[str, str]:
    return procs[0].url, procs[1].url


@pytest.fixture
def procs(vllm: Any, redis_server: RedisServer, tmp_path: Path) -> Iterator[list[GatewayProcess]]:
    redis_server.client().flushall()
    text = config(vllm[1], f"redis: {{url: '{redis_server.url}'}}").replace(
        "cache: {mode: deterministic}", "cache: {mode: deterministic, store: redis}"
    )
    path = tmp_path / "gw.yaml"
    path.write_text(text)
    other = tmp_path / "gw2.yaml"  # a config file each, so each process writes a log of its own
    other.write_text(text)
    procs = [GatewayProcess(path), GatewayProcess(other)]
    try:
        for p in procs:
            p.wait_ready()
        yield procs
    finally:
        for p in procs:
            p.stop()


def body(prompt: str) -> dict[str, Any]:
    return {"model": MODEL, "prompt": prompt, "max_tokens": 5, "temperature": 0}


def post(url: str, payload: dict[str, Any], key: str = ALICE) -> httpx.Response:
    with client(url, key) as c:
        resp = c.post("/v1/completions", json=payload)
    assert resp.status_code == 200, resp.text
    return resp


def test_an_answer_stored_by_one_process_is_a_hit_on_the_other(
    pair: tuple[str, str], upstream: Upstream, redis_server: RedisServer
) -> None:
    first, second = pair
    stored = post(first, body("redis: shared"))
    assert stored.headers["x-gateway-cache"] == "miss"
    hit = post(second, body("redis: shared"))
    assert hit.headers["x-gateway-cache"] == "hit"
    assert hit.json()["choices"] == stored.json()["choices"]
    assert len(upstream.received) == 1
    # Scope `key`: another key's identical request is its own.
    assert post(second, body("redis: shared"), BOB).headers["x-gateway-cache"] == "miss"
    assert len(upstream.received) == 2
    # No prompt text in a Redis key.
    names = [str(n) for n in redis_server.client().keys("*")]
    assert names and all("redis: shared" not in n for n in names)


# An entry of the previous format (version 1: the choices, no client bytes), well formed: a miss too.
_V1 = b"gwc1:" + msgspec.msgpack.encode(
    [1, 1e10, MODEL, "vllm", "m", None, [[{"text": "old", "index": 0, "logprobs": None, "finish_reason": "stop"}]]]
)


@pytest.mark.parametrize(
    "value",
    [b"\x00garbage", b"gwc2:\x93\x01\x02", b"gwc2:" + b"x" * 5_000_000, pytest.param(_V1, id="version-1-entry")],
)
def test_a_corrupt_or_foreign_redis_value_is_a_miss(
    pair: tuple[str, str], upstream: Upstream, redis_server: RedisServer, value: bytes
) -> None:
    first, second = pair
    post(first, body("redis: corrupt"))
    r = redis_server.client()
    names = r.keys("gwcache:*")
    assert len(names) == 1
    r.set(names[0], value)
    again = post(second, body("redis: corrupt"))
    assert again.headers["x-gateway-cache"] == "miss"
    assert len(upstream.received) == 2


def test_a_redis_outage_makes_the_cache_a_miss(
    pair: tuple[str, str], upstream: Upstream, redis_server: RedisServer
) -> None:
    first, _ = pair
    post(first, body("redis: outage"))
    redis_server.stop()
    try:
        again = post(first, body("redis: outage"))
        assert again.headers["x-gateway-cache"] == "miss"
    finally:
        redis_server.start()
    assert len(upstream.received) == 2


def _entry(stored: float, body: bytes | None, events: list[Any] | None = None) -> bytes:
    """A value of this version's shape, as a hostile or broken writer of the Redis could leave it."""
    return b"gwc2:" + msgspec.msgpack.encode([2, stored, MODEL, "local", MODEL, None, events or [], None, body])


_ANSWER = b'{"object":"text_completion","id":"x","created":1,"model":"m","choices":[{"text":"planted","index":0,'
_ANSWER += b'"logprobs":null,"finish_reason":"stop"}]}'


@pytest.mark.parametrize(
    "plant",
    [
        pytest.param(lambda r, name: (r.delete(name), r.rpush(name, "not", "a", "string")), id="a-list-not-a-string"),
        pytest.param(
            lambda r, name: r.set(name, _entry(1e9, b'{"id":"x","object":"text_completion"}')), id="no-choices"
        ),
        pytest.param(lambda r, name: r.set(name, _entry(1e9, b'{"id":"x","choices":[{"text":')), id="cut-answer"),
        pytest.param(lambda r, name: r.set(name, _entry(float("nan"), _ANSWER)), id="nan-time"),
        pytest.param(lambda r, name: r.set(name, _entry(float("inf"), _ANSWER)), id="infinite-time"),
    ],
)
@pytest.mark.parametrize("stream", [False, True], ids=["buffered", "streamed"])
def test_a_planted_or_broken_entry_is_a_miss_counted_and_logged_once(
    procs: list[GatewayProcess], upstream: Upstream, redis_server: RedisServer, plant: Any, stream: bool
) -> None:
    first, second = procs
    prompt = f"redis: planted {stream}"
    post(first.url, body(prompt))
    r = redis_server.client()
    names = r.keys("gwcache:*")
    assert len(names) == 1
    plant(r, names[0])
    with client(second.url) as c:
        again = c.post("/v1/completions", json=body(prompt) | {"stream": stream})
        assert again.status_code == 200, again.text
        assert again.headers["x-gateway-cache"] == "miss"
        assert b"planted" not in again.content
        status = c.get("/admin/status", headers={"authorization": f"Bearer {ADMIN}"}).json()["cache"]
        metrics = c.get("/metrics").text
    assert len(upstream.received) == 2
    assert status["redis_not_entries"] == 1
    # The same count, once per bad read, for Prometheus; the process that stored it read nothing bad.
    assert re.search(r"^gateway_cache_redis_not_entries_total 1\.0$", metrics, re.M), metrics[-2000:]
    with client(first.url) as c:
        assert re.search(r"^gateway_cache_redis_not_entries_total 0\.0$", c.get("/metrics").text, re.M)
    # The Redis stays in use for everything else: the miss overwrote the value, and the next read is a hit.
    assert post(first.url, body(prompt)).headers["x-gateway-cache"] == "hit"
    deadline = time.monotonic() + 5
    while True:  # the log is written off the request path
        lines = [line for line in second.log.read_text().splitlines() if "a Redis value read as an entry" in line]
        if lines or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    time.sleep(0.2)
    lines = [line for line in second.log.read_text().splitlines() if "a Redis value read as an entry" in line]
    assert len(lines) == 1, second.log.read_text()[-3000:]
