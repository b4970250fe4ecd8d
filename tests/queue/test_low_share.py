"""`queue.low_share`: `low` requests hold at most that share of a server's slots, so a `normal` arrival
starts at once beside a `low` flood instead of waiting for one of its requests to end; in one process and
across gateways sharing Redis."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from gateway.config import parse_config
from tests.helpers.engine import Engine
from tests.helpers.redis import RedisServer
from tests.helpers.servers import serve_config
from tests.queue.conftest import ask, config, gate, until


@pytest.mark.parametrize("shared", [False, True])
async def test_low_requests_leave_the_reserve_free_for_normal_ones(
    tmp_path: Path, engine: Engine, rds: RedisServer, shared: bool
) -> None:
    extra = f"redis: {{url: '{rds.url}', on_failure: fail_closed}}" if shared else ""
    with serve_config(tmp_path, config(engine, 4, queue="low_share: 0.5", extra=extra)) as gw:
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as client:
            assert (await ask(client, "quiet")).status_code == 200  # interactive traffic: the reserve holds
            engine.running.clear()  # the engine holds every request until told to run
            lows = [asyncio.ensure_future(ask(client, "batch")) for _ in range(6)]
            g = gate(gw)
            await until(lambda: engine.inflight == 2 and g.order.depth == 4)
            await asyncio.sleep(0.1)  # (the pump polls Redis every 20 ms: several rounds)
            assert engine.inflight == 2  # half of four slots, though two more are free
            normal = asyncio.ensure_future(ask(client, "quiet"))
            await until(lambda: engine.inflight == 3)  # started at once, past the four low ones waiting
            assert g.order.depth == 4
            engine.running.set()
            answers = await asyncio.gather(normal, *lows)
    assert [r.status_code for r in answers] == [200] * 7
    assert engine.peak == 3


async def test_after_a_quiet_spell_low_requests_fill_the_server(tmp_path: Path, engine: Engine) -> None:
    """No `normal` request for `low_share_hold_ms`: capacity nobody else asks for goes to `low`."""
    queue = "low_share: 0.5, low_share_hold_ms: 300"
    with serve_config(tmp_path, config(engine, 4, queue=queue)) as gw:
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as client:
            assert (await ask(client, "quiet")).status_code == 200
            await asyncio.sleep(0.4)
            engine.running.clear()
            lows = [asyncio.ensure_future(ask(client, "batch")) for _ in range(6)]
            g = gate(gw)
            await until(lambda: engine.inflight == 4 and g.order.depth == 2)
            engine.running.set()
            answers = await asyncio.gather(*lows)
    assert [r.status_code for r in answers] == [200] * 6


async def test_without_a_low_share_low_requests_fill_the_server(tmp_path: Path, engine: Engine) -> None:
    with serve_config(tmp_path, config(engine, 4)) as gw:
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as client:
            engine.running.clear()
            lows = [asyncio.ensure_future(ask(client, "batch")) for _ in range(6)]
            g = gate(gw)
            await until(lambda: engine.inflight == 4 and g.order.depth == 2)
            engine.running.set()
            answers = await asyncio.gather(*lows)
    assert [r.status_code for r in answers] == [200] * 6


def test_a_low_share_outside_its_range_names_its_path(engine: Engine) -> None:
    with pytest.raises(Exception, match=r"queue\.low_share"):
        parse_config(config(engine, 4, queue="low_share: 0"))
