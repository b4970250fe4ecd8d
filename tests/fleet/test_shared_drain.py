"""A drain sent to one gateway process reaches another through Redis (gateway/fleet/shared.py)."""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from gateway.fleet.shared import SYNC_S
from tests.helpers.redis import RedisServer
from tests.helpers.servers import GatewayThread, rewrite, serve_config
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


def test_a_drain_made_while_redis_does_not_answer_is_stored_when_it_answers(
    tmp_path: Path, replicas: list[Upstream], rds: RedisServer
) -> None:
    config = f"redis: {{url: '{rds.url}'}}\n" + fleet_config(replicas, "policy: round_robin")
    key = "gw:{fleet}:drain:engine"
    with serve_config(tmp_path, config) as gw, httpx.Client(trust_env=False, timeout=15) as c:
        base = f"{gw.url}/admin/providers/engine/replicas/1"
        assert c.post(f"{base}/drain", headers=ADMIN).json()["shared"] is True
        assert c.post(f"{base}/undrain", headers=ADMIN).json()["shared"] is True  # Redis holds the older "0"
        with rds.client() as r:
            r.execute_command("CLIENT", "PAUSE", "3000", "ALL")  # Redis keeps its data but does not answer
        answer = c.post(f"{base}/drain", headers=ADMIN).json()
        fleet = gw.pipeline.router.fleets["engine"]
        assert answer["shared"] is False and fleet.draining[1] is True
        with rds.client() as r:
            url = fleet.urls[1]
            wait_until(lambda: r.hget(key, url) == "1", timeout=15)  # stored once Redis answers again
        time.sleep(2 * SYNC_S)  # later pulls read the flag back and keep the drain
        assert fleet.draining[1] is True
        before = served(replicas)[1]
        # A new connection: `c`'s sat idle about as long as the server's keep-alive (5 s), which may close it
        # just as a request is sent on it.
        with httpx.Client(trust_env=False, timeout=15) as fresh:
            for n in range(6):
                body = {"model": "engine/m", "prompt": f"p{n}"}
                assert fresh.post(f"{gw.url}/v1/completions", json=body).is_success
        assert served(replicas)[1] == before


def test_a_flag_is_forgotten_once_no_gateway_lists_its_replica(
    tmp_path: Path, replicas: list[Upstream], rds: RedisServer
) -> None:
    routing = "policy: round_robin, drain_forget_ms: 3000"
    both = f"redis: {{url: '{rds.url}'}}\n" + fleet_config(replicas[:2], routing)
    one = f"redis: {{url: '{rds.url}'}}\n" + fleet_config(replicas[1:2], routing)
    key, removed = "gw:{fleet}:drain:engine", f"{replicas[0].url}/v1"
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text(both)
    b.write_text(both)
    with (
        GatewayThread(a, {}, poll_every=0.1) as first,
        GatewayThread(b, {}, poll_every=0.1) as second,
        rds.client() as r,
    ):
        with httpx.Client(trust_env=False, timeout=15) as c:
            for i in (0, 1):
                assert c.post(f"{first.url}/admin/providers/engine/replicas/{i}/drain", headers=ADMIN).is_success
        assert r.hget(key, removed) == "1"
        # A rollout: the first gateway's new config no longer lists replica 0; the second, still on the old
        # one, does, and keeps its flag (and the drain) past the time to forget it.
        pipeline = first.pipeline
        rewrite(a, one)
        wait_until(lambda: first.pipeline is not pipeline, timeout=15)
        time.sleep(4.5)
        assert r.hget(key, removed) == "1" and second.pipeline.router.fleets["engine"].draining[0]
        # Once no gateway lists it, its flag goes; the replica both still list keeps its own.
        pipeline = second.pipeline
        rewrite(b, one)
        wait_until(lambda: second.pipeline is not pipeline, timeout=15)
        wait_until(lambda: r.hget(key, removed) is None, timeout=10)
        assert r.hget(key, f"{replicas[1].url}/v1") == "1"
