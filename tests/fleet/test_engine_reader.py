"""The engine-metrics reader itself, against real loopback replicas: it survives a config source that fails
(one WARNING with the cause, counted, backing off), a load it read stops steering once nothing renews it, and
a reload that changes a provider's proxy or TLS settings closes the connection pool of the old ones."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import httpcore
import pytest
from aiohttp import web

from gateway.config import load_config
from gateway.fleet import metered
from gateway.fleet.engine import EngineReader, Watched, watched
from gateway.fleet.picker import Fleet
from gateway.upstream.httpx_transport import tls_context
from tests.helpers.upstreams import Received, Upstream

from .conftest import completion, fleet_config

HOT = b'vllm:num_requests_waiting{model_name="m"} 50.0\nvllm:num_requests_running{model_name="m"} 1.0\n'
FAST = "policy: least_outstanding, engine_metrics: true, metrics_interval_ms: 50, metrics_timeout_ms: 50"


async def engine(request: web.Request, received: Received) -> web.StreamResponse:
    if received.path == "/metrics":
        return web.Response(body=HOT, headers={"content-type": "text/plain"})
    return web.Response(body=completion(), content_type="application/json")


def watch(tmp_path: Path, config: str) -> tuple[Fleet, Watched]:
    path = tmp_path / f"c{len(list(tmp_path.iterdir()))}.yaml"
    path.write_text(config)
    loaded = load_config(path, env={})
    p = loaded.providers["engine"]
    fleet = Fleet("engine", p.replicas, p.routing)
    return fleet, watched({"engine": fleet}, loaded.providers)


async def until(predicate: Callable[[], object], timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.01)


@pytest.fixture
def two() -> Iterator[list[Upstream]]:
    ups = [Upstream() for _ in range(2)]
    for u in ups:
        u.start()
        u.handler = engine
    yield ups
    for u in ups:
        u.stop()


async def test_the_reader_survives_a_failing_config_source(
    tmp_path: Path, two: list[Upstream], caplog: pytest.LogCaptureFixture
) -> None:
    fleet, source = watch(tmp_path, fleet_config(two, FAST))
    failing = {"on": True}
    failed: Counter[tuple[str, str]] = Counter()

    def fleets() -> Watched:
        if failing["on"]:
            raise RuntimeError("config source broke")
        return source

    reader = EngineReader(fleets, lambda r, k: failed.update([(r, k)]), lambda p: metered.pool(tls_context(p), p.proxy))
    caplog.set_level(logging.INFO, logger="gateway.fleet")
    reader.start()
    try:
        await until(lambda: failed[("*", "reader")] >= 2)
        failing["on"] = False
        # The reader kept going: once the source answers it reads both replicas' loads.
        await until(lambda: all(load is not None for load in fleet.engine))
        assert fleet.choose([0, 0], [False, False], None)  # both hot, but still routed
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "cannot follow" in r.getMessage()]
        assert len(warnings) == 1 and "config source broke" in warnings[0].getMessage()
        assert any("follows the config again" in r.getMessage() for r in caplog.records)
    finally:
        await reader.stop()


async def test_a_load_nothing_renews_stops_steering(tmp_path: Path, two: list[Upstream]) -> None:
    async def calm(request: web.Request, received: Received) -> web.StreamResponse:
        body = HOT.replace(b" 50.0", b" 0.0")
        return web.Response(body=body, headers={"content-type": "text/plain"})

    two[1].handler = calm
    fleet, source = watch(tmp_path, fleet_config(two, FAST))
    reader = EngineReader(lambda: source, lambda r, k: None, lambda p: metered.pool(tls_context(p), p.proxy))
    reader.start()
    try:
        await until(lambda: all(load is not None for load in fleet.engine))
    finally:
        await reader.stop()  # as a reader that stalled or died: nothing renews the loads now
    # Replica 0 reports a long queue: it goes last although replica 1 has a request in flight here.
    assert fleet.choose([0, 1], [False, False], None) == [1, 0]
    # Within two intervals and timeouts (0.2 s here) the loads stop steering: unknown, routed as idle.
    await asyncio.sleep(0.3)
    assert fleet.choose([0, 1], [False, False], None) == [0, 1]
    assert fleet.load_of(0) is None and "no fresh reading" in (fleet.engine_error[0] or "")


async def test_a_reload_that_changes_the_proxy_closes_the_old_pool(tmp_path: Path, two: list[Upstream]) -> None:
    fleet, before = watch(tmp_path, fleet_config(two, FAST))
    # The same replicas through a proxy nobody listens at: the reads fail, through a pool of their own.
    proxied = fleet_config(two, FAST).replace("kind: vllm", "kind: vllm\n    proxy: http://127.0.0.1:9")
    _, after = watch(tmp_path, proxied)
    current = {"w": before}
    pools: list[httpcore.AsyncConnectionPool] = []

    def made(p: object) -> httpcore.AsyncConnectionPool:
        pool = metered.pool(tls_context(p), p.proxy)  # type: ignore[arg-type,attr-defined]
        pools.append(pool)
        return pool

    reader = EngineReader(lambda: current["w"], lambda r, k: None, made)
    reader.start()
    try:
        await until(lambda: all(load is not None for load in fleet.engine))
        assert len(pools) == 1 and pools[0].connections  # kept alive between reads
        current["w"] = after
        await until(lambda: len(pools) == 2)
        await until(lambda: not pools[0].connections, timeout=3)  # closed, not left for the keep-alive to expire
        assert len(pools[1].connections) <= 2
    finally:
        await reader.stop()
