"""A leader waiting for a queue slot does not hold the identical requests that coalesced onto it: a waiter of
a higher class, or another tenant (`scope: shared`), would otherwise wait in the leader's place in the fair
queue, behind every request that overtakes it, and could time out without ever being queued itself."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx

from tests.helpers.engine import Engine
from tests.helpers.servers import serve_config
from tests.queue.conftest import config, gate, until

CACHE = "cache: {mode: always, scope: shared}\n"
SAME = {"model": "engine/m", "prompt": "quiet hello there", "max_tokens": 1}


def _as(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer k-{key}"}


async def test_a_normal_request_does_not_wait_in_a_low_leaders_place(tmp_path: Path) -> None:
    engine = Engine(hold_s=0.6)
    with engine, serve_config(tmp_path, config(engine, 1, extra=CACHE)) as gw:
        async with httpx.AsyncClient(base_url=gw.url, timeout=30, trust_env=False) as client:

            def post(key: str, body: dict[str, object]) -> asyncio.Future[httpx.Response]:
                return asyncio.ensure_future(client.post("/v1/completions", json=body, headers=_as(key)))

            engine.running.clear()
            held = post("noisy", {**SAME, "prompt": "noisy held"})  # takes the one slot
            await until(lambda: engine.inflight == 1)
            low = post("batch", SAME)  # the batch key's default class is low: it leads, queued in that class
            await until(lambda: gate(gw).order.counts[2] == 1)
            # The identical request at normal priority, with a deadline the low leader's turn comes after.
            quiet = post("quiet", {**SAME, "inference_timeout": 3})
            await asyncio.sleep(0.3)
            overtaking = [post("noisy", {**SAME, "prompt": f"noisy {i}"}) for i in range(4)]
            await until(lambda: gate(gw).order.counts[1] == 4)
            engine.running.set()
            got = await quiet
            others = await asyncio.gather(held, low, *overtaking)
    assert got.status_code == 200, got.text
    assert got.headers["x-gateway-cache"] == "miss"  # it asked for itself, in its own class
    assert all(r.status_code == 200 for r in others)
    # Served in its fair turn (after the held request and the first normal one queued before it), not after
    # every normal request as the low leader is; the low leader still asks, after them.
    assert engine.order.index("quiet") < engine.order.index("noisy", 3)
    assert engine.order.count("quiet") == 2
