"""A worker killed mid-request (SIGKILL: no shutdown, no release) holds its lease for at most the lease
TTL: ten minutes on Redis's own clock, after which the slot frees itself (docs/ratelimits.md)."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import httpx

from gateway.limits.ratelimit import LEASE_TTL_MS
from tests.helpers.faults import FaultServer, slow
from tests.helpers.identity import bucket
from tests.helpers.redis import RedisServer
from tests.helpers.servers import GatewayProcess, cli_env
from tests.helpers.waiting import wait_until

KEY = bucket("k-lim", "concurrent")


def test_a_killed_worker_holds_its_lease_for_at_most_the_lease_ttl(
    redis: RedisServer, faults: FaultServer, tmp_path: Path
) -> None:
    faults["up"].script(then=slow(20.0))
    path = tmp_path / "crash.yaml"
    path.write_text(
        f'redis: {{url: "{redis.url}"}}\n'
        "keys:\n  - {name: lim, key: k-lim, limits: {concurrent: 2}}\n"
        f"providers:\n  up: {{kind: openai, api_key: sk-up, base_url: {faults['up'].base_url}}}\n"
    )
    gw = GatewayProcess(path, cli_env())
    caller: threading.Thread | None = None
    try:
        gw.wait_ready()

        def call() -> None:
            with httpx.Client(trust_env=False, timeout=30) as c:
                body = {"model": "up/davinci-002", "prompt": "Say this is a test", "max_tokens": 7}
                try:
                    c.post(gw.url + "/v1/completions", json=body, headers={"authorization": "Bearer k-lim"})
                except httpx.HTTPError:
                    pass  # the gateway dies under it

        caller = threading.Thread(target=call, daemon=True)
        caller.start()
        wait_until(lambda: faults["up"].count == 1, timeout=10)
        os.kill(gw.proc.pid, signal.SIGKILL)
        gw.proc.wait(10)
        with redis.client() as r:
            sec, usec = r.time()
            now = int(sec) * 1000 + int(usec) // 1000
            ((lease, expiry),) = r.zrange(KEY, 0, -1, withscores=True)
            assert now < expiry <= now + LEASE_TTL_MS, "the orphaned lease must expire within the lease TTL"
            assert 0 < r.pttl(KEY) <= LEASE_TTL_MS
    finally:
        gw.stop()
        if caller is not None:
            caller.join(10)
    assert LEASE_TTL_MS == 600_000  # the bound docs/ratelimits.md states
