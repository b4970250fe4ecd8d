"""A replica's health shared through Redis belongs to the replica, not to its position in `replicas:`: a list
reordered or shortened by a reload (or differing between gateway processes) moves no cooldown onto another
replica (docs/fleets.md)."""

from __future__ import annotations

from pathlib import Path

import httpx
from aiohttp import web

from tests.helpers.redis import RedisServer
from tests.helpers.servers import GatewayThread
from tests.helpers.upstreams import Received, Upstream
from tests.helpers.waiting import wait_until

from .conftest import fleet_config, served

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
