"""A drain sent to one gateway process reaches another through Redis (gateway/fleet/shared.py)."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.helpers.redis import RedisServer
from tests.helpers.servers import serve_config
from tests.helpers.upstreams import Upstream
from tests.helpers.waiting import wait_until

from .conftest import fleet_config, served

ADMIN = {"authorization": "Bearer admin-fleet-key"}


def test_a_drain_reaches_every_gateway_process_sharing_redis(
    tmp_path: Path, replicas: list[Upstream], rds: RedisServer
) -> None:
    config = f"redis: {{url: '{rds.url}'}}\n" + fleet_config(replicas, "policy: round_robin")
    with serve_config(tmp_path, config) as first, serve_config(tmp_path, config) as second:
        with httpx.Client(trust_env=False, timeout=15) as c:
            r = c.post(f"{first.url}/admin/providers/engine/replicas/1/drain", headers=ADMIN)
            assert r.status_code == 200 and r.json()["shared"] is True
            fleet = second.pipeline.router.fleets["engine"]
            wait_until(lambda: fleet.draining[1], timeout=5)
            before = served(replicas)[1]
            for n in range(6):
                assert c.post(f"{second.url}/v1/completions", json={"model": "engine/m", "prompt": f"{n}"}).is_success
            assert served(replicas)[1] == before
            assert c.post(f"{second.url}/admin/providers/engine/replicas/1/undrain", headers=ADMIN).is_success
            wait_until(lambda: not first.pipeline.router.fleets["engine"].draining[1], timeout=5)
