"""A replica's state shared through Redis (health, concurrency slots) belongs to the replica, not to its position
in `replicas:`: a list reordered or shortened by a reload, or differing between gateway processes, moves no
cooldown or slot onto another replica (docs/fleets.md)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
from aiohttp import web

from tests.helpers.redis import RedisServer
from tests.helpers.servers import GatewayThread, serve_config
from tests.helpers.upstreams import Received, Upstream
from tests.helpers.waiting import wait_until

from .conftest import completion, fleet_config, served

ADMIN = {"authorization": "Bearer admin-fleet-key"}


def test_removing_a_cooling_replica_leaves_its_cooldown_behind(
    tmp_path: Path, replicas: list[Upstream], rds: RedisServer
) -> None:
    async def limited(request: web.Request, received: Received) -> web.StreamResponse:
        return web.Response(status=429, headers={"retry-after": "30"}, text='{"error": {"message": "busy"}}')

    replicas[0].handler = limited
    config = tmp_path / "fleet.yaml"
    shared = f"redis: {{url: '{rds.url}'}}\n"
    config.write_text(shared + fleet_config(replicas, "policy: round_robin"))
    with GatewayThread(config, {}) as gw, httpx.Client(base_url=gw.url, trust_env=False, timeout=15) as c:
        for n in range(3):
            assert c.post("/v1/completions", json={"model": "engine/m", "prompt": f"{n}"}).status_code == 200

        def cooling() -> dict[str, int]:
            targets = c.get("/admin/status", headers=ADMIN).json()["targets"]
            return {t["target"]: t["cooling_ms"] for t in targets if t["cooling_ms"] > 0}

        assert list(cooling()) == ["engine@0/m"]
        # The operator takes the rate-limited replica out: the second replica is `engine@0` from now on.
        config.write_text(shared + fleet_config(replicas[1:], "policy: round_robin"))
        wait_until(lambda: gw.pipeline.router.fleets["engine"].size == 2, timeout=15)
        before = served(replicas)
        for n in range(6):
            r = c.post("/v1/completions", json={"model": "engine/m", "prompt": f"after {n}"})
            assert r.status_code == 200
        now = served(replicas)
        assert cooling() == {}
        assert [b - a for a, b in zip(before, now, strict=True)] == [0, 3, 3], (before, now)


async def test_a_replicas_slots_in_redis_are_its_own_whatever_its_position(
    tmp_path: Path, replicas: list[Upstream], rds: RedisServer
) -> None:
    """Two gateways share Redis and a provider name but list different replicas (a rollout, two regions): each
    lists one, so both call theirs `engine@0`. A request holding the only slot of the first gateway's replica
    leaves the second's replica free: its slots are counted under its URL, not under `engine@0`."""

    async def slow(request: web.Request, received: Received) -> web.StreamResponse:
        await asyncio.sleep(2.5)
        return web.Response(body=completion(), content_type="application/json")

    replicas[0].handler = slow
    shared = f"redis: {{url: '{rds.url}'}}\n"
    capped = "    discover: false\n    max_concurrency: 1\n"

    def config(up: Upstream) -> str:
        return shared + fleet_config([up], "policy: round_robin").replace("    discover: false\n", capped)

    with serve_config(tmp_path, config(replicas[0])) as first, serve_config(tmp_path, config(replicas[1])) as second:
        async with httpx.AsyncClient(trust_env=False, timeout=15) as c:
            body = {"model": "engine/m", "prompt": "x"}
            held = asyncio.create_task(c.post(f"{first.url}/v1/completions", json=body))
            await asyncio.sleep(0.5)  # the first replica's one slot is taken
            started = time.monotonic()
            r = await c.post(f"{second.url}/v1/completions", json=body)
            took = time.monotonic() - started
            assert r.status_code == 200 and (await held).status_code == 200
    assert took < 1.0, took  # not queued behind another server's request
