"""A config reload while Redis holds the queue's leases: every waiting request is served, the server never
sees more than the cap (a lowered cap once the slots held before it end), and no lease outlives its request.

The reload is the one the gateway runs itself (it polls the config file), on its own event loop.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web

from tests.helpers.engine import Engine
from tests.helpers.redis import RedisServer
from tests.helpers.servers import rewrite, serve_config
from tests.helpers.upstreams import Received
from tests.queue.conftest import ask, config, gate, until

_KEY = "rl:{queue:engine}:concurrent"  # the gate's lease set (gateway/queue/gate.py, `Bucket.redis_key`)


class Counting(Engine):
    """The engine, noting when each request started and how many it had in flight with it."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.starts: list[tuple[float, int]] = []  # (when, in flight with it), in order
        serve = self.handler

        async def noted(request: web.Request, received: Received) -> web.StreamResponse:
            # `_serve` counts the request before its first await: nothing runs between the two.
            self.starts.append((time.monotonic(), self.inflight + 1))
            return await serve(request, received)

        self.handler = noted


def _live(rds: RedisServer) -> int:
    """The leases Redis holds for the engine's server now (a released one is gone, a cancel is negative)."""
    now = rds.time_ms()
    with rds.client() as r:
        return sum(1 for _, expiry in r.zrange(_KEY, 0, -1, withscores=True) if expiry > now)


def _text(engine: Engine, rds: RedisServer, cap: int, ttl_ms: int | None, n: int) -> str:
    ttl = f", lease_ttl_ms: {ttl_ms}" if ttl_ms is not None else ""
    # The comment makes every version of the file differ, so the gateway's poll sees an edit.
    return config(engine, cap, extra=f"redis: {{url: '{rds.url}'{ttl}}}\n# version {n}\n")


async def _reload(gw: Any, path: Path, text: str) -> None:
    """Edit the file and wait for the gateway's own poll to swap the pipeline in."""
    before = gw.app.state.reloader.reloads
    rewrite(path, text)
    await until(lambda: gw.app.state.reloader.reloads > before, timeout=15)


@pytest.mark.parametrize(("before", "after"), [(2, 2), (3, 1), (1, 3)], ids=["same", "lowered", "raised"])
async def test_a_reload_serves_every_waiting_request_within_the_cap_and_leaks_no_lease(
    tmp_path: Path, rds: RedisServer, before: int, after: int
) -> None:
    waiting = 6
    with (
        Counting(hold_s=0.05) as engine,
        serve_config(tmp_path, _text(engine, rds, before, None, 0), poll_every=0.1) as gw,
    ):
        path = Path(gw.app.state.reloader.path)
        old = gate(gw)
        async with httpx.AsyncClient(base_url=gw.url, timeout=60) as client:
            engine.running.clear()
            held = [asyncio.ensure_future(ask(client, "noisy")) for _ in range(before)]
            await until(lambda: engine.inflight == before)
            queued = [asyncio.ensure_future(ask(client, "quiet")) for _ in range(waiting)]
            await until(lambda: old.order.depth == waiting)
            assert _live(rds) == before  # each request in flight holds one lease
            await _reload(gw, path, _text(engine, rds, after, None, 1))
            assert gate(gw) is old and old.cap == after  # the same queue, under the new cap
            # A raised cap lets waiters start at once; a lowered one starts none while the old slots run.
            await until(lambda: engine.inflight == max(before, after))
            await asyncio.sleep(0.2)
            assert engine.inflight == max(before, after) and _live(rds) == max(before, after)
            engine.running.set()
            answers = await asyncio.gather(*held, *queued)
            await until(lambda: old.in_use == 0 and _live(rds) == 0, timeout=5)
    assert [r.status_code for r in answers] == [200] * (before + waiting)
    assert sorted(engine.order) == ["noisy"] * before + ["quiet"] * waiting
    # The held requests started under the old cap, every waiter under the new one (with a lowered cap, the
    # slots held before the reload ended before any waiter started).
    counts = [n for _, n in engine.starts]
    assert len(counts) == before + waiting
    assert max(counts[:before]) == before and max(counts[before:]) <= after
    assert old.order.depth == 0
    with rds.client() as r:
        assert all(expiry < 0 for _, expiry in r.zrange(_KEY, 0, -1, withscores=True))  # cancel markers at most


async def test_a_slot_held_across_a_reload_longer_than_the_lease_ttl_keeps_its_lease(
    tmp_path: Path, rds: RedisServer
) -> None:
    """The replaced config's limiter goes on renewing the leases of its requests still running: none
    expires under them, so no waiter is let in beside them."""
    with Counting() as engine, serve_config(tmp_path, _text(engine, rds, 2, 1000, 0), poll_every=0.1) as gw:
        path = Path(gw.app.state.reloader.path)
        old = gate(gw)
        async with httpx.AsyncClient(base_url=gw.url, timeout=60) as client:
            engine.running.clear()
            held = [asyncio.ensure_future(ask(client, "noisy")) for _ in range(2)]
            await until(lambda: engine.inflight == 2)
            queued = [asyncio.ensure_future(ask(client, "quiet")) for _ in range(3)]
            await until(lambda: old.order.depth == 3)
            await _reload(gw, path, _text(engine, rds, 2, 1000, 1))
            ends = time.monotonic() + 2.5  # two and a half lease TTLs
            while time.monotonic() < ends:
                assert engine.inflight == 2 and _live(rds) == 2
                await asyncio.sleep(0.05)
            engine.running.set()
            answers = await asyncio.gather(*held, *queued)
            await until(lambda: old.in_use == 0 and _live(rds) == 0, timeout=5)
    assert [r.status_code for r in answers] == [200] * 5
    assert engine.peak == 2


async def test_the_replaced_configs_last_requests_give_their_leases_back_as_it_closes(
    tmp_path: Path, rds: RedisServer
) -> None:
    """The requests holding slots are the replaced pipeline's last: it closes (its Redis connection too) as
    they end, and their releases still reach Redis; the requests that came after the reload get the slots."""
    with Counting(hold_s=0.05) as engine, serve_config(tmp_path, _text(engine, rds, 2, None, 0), poll_every=0.1) as gw:
        path = Path(gw.app.state.reloader.path)
        old = gate(gw)
        async with httpx.AsyncClient(base_url=gw.url, timeout=60) as client:
            engine.running.clear()
            held = [asyncio.ensure_future(ask(client, "noisy")) for _ in range(2)]
            await until(lambda: engine.inflight == 2)
            await _reload(gw, path, _text(engine, rds, 2, None, 1))
            queued = [asyncio.ensure_future(ask(client, "quiet")) for _ in range(4)]
            await until(lambda: old.order.depth == 4)
            engine.running.set()
            answers = await asyncio.gather(*held, *queued)
            await until(lambda: old.in_use == 0 and _live(rds) == 0, timeout=5)
    assert [r.status_code for r in answers] == [200] * 6
    assert max(n for _, n in engine.starts) == 2


async def test_a_lowered_cap_holds_across_two_gateways_sharing_redis(tmp_path: Path, rds: RedisServer) -> None:
    """Each gateway counts only its own slots: the lowered cap across both is the one Redis checks."""
    with (
        Counting(hold_s=0.05) as engine,
        serve_config(tmp_path, _text(engine, rds, 2, None, 0), poll_every=0.1) as one,
        serve_config(tmp_path, _text(engine, rds, 2, None, 0), poll_every=0.1) as two,
    ):
        gws = (one, two)
        async with (
            httpx.AsyncClient(base_url=one.url, timeout=60) as a,
            httpx.AsyncClient(base_url=two.url, timeout=60) as b,
        ):
            engine.running.clear()
            held = [asyncio.ensure_future(ask(c, "noisy")) for c in (a, b)]
            await until(lambda: engine.inflight == 2)
            queued = [asyncio.ensure_future(ask(c, "quiet")) for c in (a, b) for _ in range(3)]
            await until(lambda: all(gate(gw).order.depth == 3 for gw in gws))
            for gw in gws:
                await _reload(gw, Path(gw.app.state.reloader.path), _text(engine, rds, 1, None, 1))
            engine.running.set()
            answers = await asyncio.gather(*held, *queued)
            await until(lambda: _live(rds) == 0, timeout=5)
    assert [r.status_code for r in answers] == [200] * 8
    counts = [n for _, n in engine.starts]
    assert max(counts[:2]) == 2 and max(counts[2:]) == 1


@pytest.mark.parametrize("ttl_ms", [None, 1000], ids=["leak", "renewal"])
async def test_two_reloads_keep_the_leases_a_replaced_config_handed_out(
    tmp_path: Path, rds: RedisServer, ttl_ms: int | None
) -> None:
    """A waiter of the first config gets its slot under the second, whose limiter takes its lease; a third
    config then replaces the second (which has no request of its own, so it closes at once). The lease
    must still be renewed while its request runs, and released when it ends."""
    with (
        Counting(hold_s=0.05) as engine,
        serve_config(tmp_path, _text(engine, rds, 1, ttl_ms, 0), poll_every=0.1) as gw,
    ):
        path = Path(gw.app.state.reloader.path)
        old = gate(gw)
        async with httpx.AsyncClient(base_url=gw.url, timeout=60) as client:
            engine.running.clear()
            held = asyncio.ensure_future(ask(client, "noisy"))
            await until(lambda: engine.inflight == 1)
            queued = [asyncio.ensure_future(ask(client, "quiet")) for _ in range(3)]
            await until(lambda: old.order.depth == 3)
            await _reload(gw, path, _text(engine, rds, 2, ttl_ms, 1))  # one waiter starts, on the new lease
            await until(lambda: engine.inflight == 2)
            await _reload(gw, path, _text(engine, rds, 2, ttl_ms, 2))
            ends = time.monotonic() + 2.5  # two and a half lease TTLs (with the short one)
            while time.monotonic() < ends:
                assert engine.inflight == 2 and _live(rds) == 2
                await asyncio.sleep(0.05)
            engine.running.set()
            answers = await asyncio.gather(held, *queued)
            await until(lambda: old.in_use == 0 and _live(rds) == 0, timeout=5)
    assert [r.status_code for r in answers] == [200] * 4
    assert max(n for _, n in engine.starts) == 2
