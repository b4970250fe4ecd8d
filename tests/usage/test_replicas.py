"""Two `python -m gateway serve` processes sharing one real redis-server book into the same usage: each
answers /admin/usage with the same totals, and a budget spent through one is enforced by the other."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.clients import body, client
from tests.helpers.redis import RedisServer
from tests.helpers.servers import GatewayProcess, cli_env

from .conftest import ENV, FREE_KEY, TEAM_KEY, config, usage, wait_requests


@pytest.fixture
def replicas(rds: RedisServer, tmp_path: Path) -> Iterator[list[GatewayProcess]]:
    procs: list[GatewayProcess] = []
    try:
        for i in range(2):
            path = tmp_path / f"replica{i}.yaml"
            path.write_text(config(rds.url))
            procs.append(GatewayProcess(path, cli_env(**ENV)))
        for p in procs:
            p.wait_ready()
        yield procs
    finally:
        for p in procs:
            p.stop()


def test_replicas_share_usage_and_budgets(replicas: list[GatewayProcess]) -> None:
    a, b = replicas
    with client(a.url, TEAM_KEY) as ca, client(b.url, TEAM_KEY) as cb:
        assert ca.post("/v1/completions", json=body()).status_code == 200
        assert cb.post("/v1/completions", json=body(model="fast")).status_code == 200
        wait_requests(a.url, "team", 2)
        assert ca.post("/v1/completions", json=body()).status_code == 200
    with client(b.url, FREE_KEY) as c:
        for _ in range(3):
            assert c.post("/v1/completions", json=body(model="demo/text", max_tokens=4)).status_code == 200
    wait_requests(a.url, "team", 3)
    wait_requests(b.url, "free", 3)
    # Each replica writes its bookings to Redis every 0.5 s and adds only its own unwritten ones to a
    # report, so the two agree once both have written: wait for that (bounded).
    deadline = time.monotonic() + 5
    seen_a, seen_b = usage(a.url), usage(b.url)
    while seen_a != seen_b and time.monotonic() < deadline:
        time.sleep(0.1)
        seen_a, seen_b = usage(a.url), usage(b.url)
    assert seen_a == seen_b
    team = seen_a["keys"]["team"]
    assert (team["requests"], team["prompt_tokens"], team["completion_tokens"], team["cost"]) == (3, 9, 21, 0.051)
    assert team["by_model"]["fast"]["requests"] == 1
    assert seen_a["keys"]["free"]["cost"] == 0.0021
    # $0.051 booked through both replicas: each refuses the key now.
    for gw in (a, b):
        with client(gw.url, TEAM_KEY) as c:
            resp = c.post("/v1/completions", json=body())
        assert resp.status_code == 429
        assert resp.json()["error"]["code"] == "budget_exceeded"
