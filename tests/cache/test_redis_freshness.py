"""An entry in a shared Redis serves no longer than `ttl_s` after its time as this replica's clock counts it,
whatever expiry its writer gave it: one stamped in the past beyond `ttl_s`, or far in the future (another
replica's clock running ahead, or a writer that is no gateway), is a miss; one stamped up to
`entry.CLOCK_SKEW_S` ahead is taken as clock skew and serves."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis
from msgspec.structs import replace

from gateway.cache.entry import CLOCK_SKEW_S, dump, held
from tests.helpers.redis import RedisServer
from tests.helpers.servers import GatewayThread, serve_config
from tests.helpers.upstreams import Upstream
from tests.helpers.waiting import wait_until

from .conftest import ADMIN, MODEL, client, config

TTL_S = 600


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="module")
def gw(vllm: Any, redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayThread]:
    text = config(vllm[1], f"redis: {{url: '{redis_server.url}'}}").replace(
        "cache: {mode: deterministic}", f"cache: {{mode: deterministic, store: redis, ttl_s: {TTL_S}}}"
    )
    with serve_config(tmp_path_factory.mktemp("fresh"), text) as gateway:
        yield gateway


def _restamped(redis_server: RedisServer, ahead_s: float) -> None:
    """The one stored entry written again as another writer could: its time `ahead_s` from now (negative: in the
    past), without any expiry."""
    with redis.Redis(host="127.0.0.1", port=redis_server.port, socket_timeout=5) as r:  # values as bytes
        names = r.keys("gwcache:*")
        assert len(names) == 1
        raw = r.get(names[0])
        assert isinstance(raw, bytes)
        r.set(names[0], dump(replace(held(raw), stored=time.time() + ahead_s)))
        assert r.ttl(names[0]) == -1  # Redis would keep it for ever


def _not_entries(c: httpx.Client) -> int:
    return int(
        c.get("/admin/status", headers={"authorization": f"Bearer {ADMIN}"}).json()["cache"]["redis_not_entries"]
    )


@pytest.mark.parametrize(
    ("ahead_s", "served"),
    [
        pytest.param(-(TTL_S + 5), False, id="older-than-ttl"),
        pytest.param(-(TTL_S - 60), True, id="within-ttl"),
        pytest.param(CLOCK_SKEW_S / 2, True, id="ahead-within-skew"),
        pytest.param(3600, False, id="an-hour-ahead"),
        pytest.param(86400 * 365, False, id="a-year-ahead"),
    ],
)
@pytest.mark.parametrize("stream", [False, True], ids=["buffered", "streamed"])
def test_an_entry_serves_only_within_its_ttl_by_this_replicas_clock(
    gw: GatewayThread, upstream: Upstream, redis_server: RedisServer, ahead_s: float, served: bool, stream: bool
) -> None:
    r = redis_server.client()
    r.flushall()
    payload = {"model": MODEL, "prompt": f"fresh: {ahead_s} {stream}", "max_tokens": 4, "temperature": 0}
    old = served and ahead_s < -30
    with client(gw.url) as c:
        first = c.post("/v1/completions", json=payload)
        assert first.headers["x-gateway-cache"] == "miss"
        _restamped(redis_server, ahead_s)
        before = _not_entries(c)
        again = c.post("/v1/completions", json=payload | {"stream": stream})
        assert again.status_code == 200, again.text
        assert again.headers["x-gateway-cache"] == ("hit" if served else "miss")
        if served:
            assert max(-ahead_s, 0) <= int(again.headers["age"]) <= max(-ahead_s, 0) + 5
        # A time far ahead is no answer's: counted and logged as a value that is not an entry (an old one is
        # merely expired). Either way the answer fetched again overwrites it, with an expiry.
        assert _not_entries(c) == before + (ahead_s > CLOCK_SKEW_S)
        if not served:  # a stream's answer is written once its client has read the end: waited for
            wait_until(lambda: r.ttl(r.keys("gwcache:*")[0]) > 0, timeout=10)
        # Asked for an answer at most 30 s old, one stamped ahead within the skew is as fresh as one stored now.
        recent = c.post("/v1/completions", json=payload, headers={"cache-control": "max-age=30"})
        assert recent.headers["x-gateway-cache"] == ("miss" if old else "hit")
    assert len(upstream.received) == 1 + (not served) + old
    ttl = r.ttl(r.keys("gwcache:*")[0])
    if served and not old:
        assert ttl == -1  # the planted value, served as it is
    else:
        assert 0 < ttl <= TTL_S  # the answer fetched again, stored with its expiry
