"""Daily budgets end to end: a key at or over `max_cost_per_day` is refused before any upstream call,
with 429 in the route's dialect, `code: budget_exceeded` and Retry-After = seconds to 00:00 UTC.

Served by the real gateway (uvicorn in a thread), with a real redis-server and without Redis.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.limits.usage import to_midnight
from tests.helpers.clients import body, client
from tests.helpers.redis import RedisServer
from tests.helpers.servers import GatewayThread
from tests.helpers.waiting import wait_until

from .conftest import COST, ENV, FREE_KEY, TEAM_KEY, config, wait_requests

PAIS = "/api/v1/compatibility/openai/v1/completions"
MESSAGE = "Key 'team' has reached its daily budget of $0.05 ($0.051 spent today, UTC); requests resume at 00:00 UTC"


@pytest.fixture(params=["memory", "redis"])
def gw(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[GatewayThread]:
    url = request.getfixturevalue("rds").url if request.param == "redis" else ""
    path = tmp_path / "config.yaml"
    path.write_text(config(url))
    with GatewayThread(path, ENV) as g:
        yield g


def spend_the_budget(gw: GatewayThread) -> None:
    """Three requests of $0.017 each (one streamed): $0.051, at or over the $0.05 budget."""
    with client(gw.url, TEAM_KEY) as c:
        assert c.post("/v1/completions", json=body()).status_code == 200
        assert c.post(PAIS, json=body(model="fast")).status_code == 200
        # Not yet at the budget ($0.034): a stream is served, and its usage (reported in its last event) is booked.
        with c.stream("POST", "/v1/completions", json=body(stream=True)) as resp:
            assert resp.status_code == 200
            assert resp.read().endswith(b"data: [DONE]\n\n")
    data = wait_requests(gw.url, "team", 3)
    assert data["keys"]["team"]["cost"] == 0.051


def test_budget_refuses_in_the_openai_shape(gw: GatewayThread) -> None:
    spend_the_budget(gw)
    with client(gw.url, TEAM_KEY) as c:
        before = time.time()
        resp = c.post("/v1/completions", json=body())
        after = time.time()
    assert resp.status_code == 429
    assert resp.json() == {
        "error": {
            "message": f"{MESSAGE}, in {resp.headers['retry-after']} s",
            "type": "rate_limit_error",
            "param": None,
            "code": "budget_exceeded",
        }
    }
    assert to_midnight(before) >= int(resp.headers["retry-after"]) >= to_midnight(after)
    # Refused before any upstream call: nothing more was booked, and the key stays refused.
    with client(gw.url, TEAM_KEY) as c:
        assert c.post("/v1/completions", json=body(model="fast", stream=True)).status_code == 429
    assert wait_requests(gw.url, "team", 3)["keys"]["team"]["cost"] == pytest.approx(3 * COST)
    # Other keys are not affected.
    with client(gw.url, FREE_KEY) as c:
        assert c.post("/v1/completions", json=body()).status_code == 200


WIDE_CONFIG = """
redis: {{url: "{redis}"}}
keys:
  - {{name: wide, key: "{key}", max_cost_per_day: 1000000}}
prices:
  "demo/*": {{prompt_per_1m: 100, completion_per_1m: 100}}
providers:
  demo: {{kind: fake, models: [text]}}
"""


def test_a_worst_case_past_64_bits_of_picodollars_leaves_redis_in_use(rds: RedisServer, tmp_path: Path) -> None:
    """`max_tokens` of 2**63 - 1 and `n` of 128 cost more picodollars than a Redis counter holds: the
    reservation is the budget at most, so Redis takes it (an error there would put every tenant on
    in-process state) and it is given back whole when the provider refuses the request."""
    path = tmp_path / "config.yaml"
    path.write_text(WIDE_CONFIG.format(redis=rds.url, key=FREE_KEY))
    with GatewayThread(path, ENV) as g, client(g.url, FREE_KEY) as c:
        huge = c.post("/v1/completions", json=body(model="demo/text", max_tokens=2**63 - 1, n=128))
        assert huge.status_code == 400 and huge.json()["error"]["param"] == "max_tokens", huge.text
        assert c.get("/ready").json() == {"status": "ready", "redis": "ok"}
        r = rds.client()
        counters = [k for k in r.keys("budget:*") if r.hexists(k, "reserved")]
        assert counters
        wait_until(lambda: all(int(r.hget(k, "reserved") or 0) == 0 for k in counters))
        assert c.post("/v1/completions", json=body(model="demo/text")).status_code == 200
        assert c.get("/ready").json() == {"status": "ready", "redis": "ok"}


def test_budget_refuses_in_the_pais_shape(gw: GatewayThread) -> None:
    spend_the_budget(gw)
    with client(gw.url, TEAM_KEY) as c:
        before = time.time()
        resp = c.post(PAIS, json=body())
        after = time.time()
    assert resp.status_code == 429
    assert resp.json() == {"detail": f"{MESSAGE}, in {resp.headers['retry-after']} s"}
    assert to_midnight(before) >= int(resp.headers["retry-after"]) >= to_midnight(after)


def test_the_check_reads_only_booked_spend(gw: GatewayThread) -> None:
    """Two requests ($0.034) leave room: the third is served even though it takes the key over the budget."""
    with client(gw.url, TEAM_KEY) as c:
        for _ in range(2):
            assert c.post("/v1/completions", json=body()).status_code == 200
        wait_requests(gw.url, "team", 2)
        assert c.post("/v1/completions", json=body(max_tokens=20)).status_code == 200  # $0.043 more
        data = wait_requests(gw.url, "team", 3)
        assert data["keys"]["team"]["cost"] == 0.077
        assert c.post("/v1/completions", json=body()).status_code == 429


def test_a_redis_outage_falls_back_to_in_process_spend(rds: RedisServer, tmp_path: Path) -> None:
    """With Redis configured but gone, bookings and the budget check run on this process's own numbers."""
    path = tmp_path / "config.yaml"
    path.write_text(config(rds.url))
    with GatewayThread(path, ENV) as gw:
        rds.stop()
        try:
            spend_the_budget(gw)
            with client(gw.url, TEAM_KEY) as c:
                assert c.post("/v1/completions", json=body()).json()["error"]["code"] == "budget_exceeded"
        finally:
            rds.start()
