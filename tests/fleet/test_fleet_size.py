"""A fleet's size is bounded and its cost per request small: the ring's points are capped, a request finds its
replicas in ring order in a few steps per replica, and a `replicas:` list over the cap is refused
(docs/fleets.md)."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import httpx
import pytest

from gateway.config import MAX_REPLICAS, ConfigError, parse_config
from tests.helpers.servers import serve_config
from tests.helpers.upstreams import Upstream

from .conftest import fleet_config

SESSIONS = [f"trajectory-{n}" for n in range(12)]


def test_a_large_weighted_fleet_costs_each_request_little_and_its_size_is_capped(
    tmp_path: Path, replicas: list[Upstream]
) -> None:
    """64 replicas at weight 100, one at 0.01 (61 of them drained, so the three live ones serve): finding a
    session's replicas in ring order takes a few steps per replica, not a walk over a million points; and
    more replicas than the cap are refused with the path that says so."""
    live = [f"{{url: {u.url}/v1, weight: 100}}" for u in replicas]
    drained = [f"{{url: http://127.0.0.1:9/v1/r{n}, weight: 100, drain: true}}" for n in range(60)]
    light = ["{url: http://127.0.0.1:9/v1/light, weight: 0.01, drain: true}"]
    config = fleet_config(replicas, "policy: session", replicas=", ".join(live + drained + light))
    with serve_config(tmp_path, config) as gw, httpx.Client(base_url=gw.url, trust_env=False, timeout=15) as c:
        took = []
        for s in SESSIONS * 3:
            started = time.perf_counter()
            r = c.post("/v1/completions", json={"model": "engine/m", "prompt": "x"}, headers={"x-session-id": s})
            took.append(time.perf_counter() - started)
            assert r.status_code == 200, r.text
    assert statistics.median(took) < 0.03, sorted(took)
    many = ", ".join(f"http://127.0.0.1:9/v1/r{n}" for n in range(MAX_REPLICAS + 1))
    with pytest.raises(ConfigError, match=r"providers\.engine\.replicas"):
        parse_config(fleet_config([], "policy: session", replicas=many), env={})
