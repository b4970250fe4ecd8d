"""Redis Sentinel: the gateway follows the master two real sentinels name, through a failover mid-load.

`redis+sentinel://host:port,host:port/service` names the sentinels and the service. Both clients (the
pool and the rate-limit channel) ask the sentinels for the master; after `SENTINEL FAILOVER` the old
master answers READONLY (or drops the connection), and both find the new one.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from gateway.limits.ratelimit import Bucket, Limiter
from gateway.state import SharedState
from tests.helpers.clients import body, client
from tests.helpers.identity import bucket, usage
from tests.helpers.redis import Sentinels, load_through
from tests.helpers.servers import serve_config

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def sentinels(tmp_path: Path) -> Iterator[Sentinels]:
    made = Sentinels(tmp_path)
    try:
        yield made
    finally:
        made.stop()


def master(s: Sentinels) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=s.master_port(), socket_timeout=5)


def test_the_gateway_keeps_its_state_on_the_sentinels_master(sentinels: Sentinels, tmp_path: Path) -> None:
    config = f"""
redis: {{url: "{sentinels.url}", on_failure: fail_closed}}
keys:
  - {{name: three, key: k-three, limits: {{rpm: 3}}}}
providers:
  demo: {{kind: fake}}
"""
    with serve_config(tmp_path, config) as gw:
        with client(gw.url, "k-three") as c:
            codes = [c.post("/v1/completions", json=body("demo/long")).status_code for _ in range(4)]
        assert codes == [200, 200, 200, 429]
    day = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d")
    with master(sentinels) as r:
        assert r.exists(bucket("k-three", "rpm"))
        assert int(r.hget(usage(day, "k-three"), "requests:demo/other") or 0) == 3


@pytest.mark.parametrize("fail_open", [True, False])
async def test_a_sentinel_failover_mid_load(sentinels: Sentinels, fail_open: bool) -> None:
    """Nothing fails beyond the fail mode, the bucket admits at most what a second bucket of the same
    limit would over the run (the documented bound per process), and Redis is used again afterwards:
    on the new master, which holds the bucket the load charged."""
    shared = SharedState(sentinels.url)
    limiter = Limiter(shared, fail_open=fail_open)
    limit = 30
    buckets = [Bucket(scope="key:failover", kind="rpm", limit=limit)]
    old = sentinels.master_port()
    try:
        tally = await load_through(limiter, buckets, sentinels.failover)
        assert tally.unexpected == []
        if fail_open:
            assert tally.redis_down == 0
        one_bucket = limit + tally.seconds * limit / 60
        assert limit <= tally.allowed <= 2 * one_bucket, vars(tally)
        assert sentinels.master_port() != old
        assert not (await limiter.acquire(buckets, 0)).allowed
        with master(sentinels) as r:
            assert r.exists("rl:{key:failover}:rpm")
            assert r.info("replication")["role"] == "master"
    finally:
        await limiter.close()
        await shared.close()
