"""A key's shared counters are its identity's, never its name's: rate-limit buckets, budgets, usage.

Real gateways (uvicorn in threads) share one real redis-server and the in-process fake provider. `a` and
`b` are configured differently but each has a key named `tenant`, with different secrets: one tenant
exhausting its limit or budget must not limit the other. `c` is a replica of `a` (the same key): it shares
`a`'s counters, so a limit holds exactly across the two. Secrets are fresh per test, so the session's Redis
holds no earlier counters of these keys.
"""

from __future__ import annotations

import datetime as dt
import uuid
from pathlib import Path
from typing import Any

import httpx

from gateway.limits.auth import fingerprint
from tests.helpers.clients import body, client
from tests.helpers.identity import bucket, usage
from tests.helpers.redis import RedisServer
from tests.helpers.servers import serve_config
from tests.helpers.waiting import wait_until

ADMIN = "adm-identity-51f3"
CONFIG = """
redis: {{url: "{redis}"}}
admin: {{key: "{admin}"}}
retries: {{attempts: 1}}
{ledger}keys:
  - {{name: tenant, key: "{secret}", {limits}}}
prices:
  demo/long: {{prompt_per_1m: 1000, completion_per_1m: 2000}}
providers:
  demo: {{kind: fake, models: [long]}}
"""
RPM = "limits: {rpm: 3}"
BUDGET = "max_cost_per_day: 0.05"  # a `body()` costs $0.017 (3 prompt + 7 completion tokens): 3 fit


def secrets() -> tuple[str, str]:
    tag = uuid.uuid4().hex[:8]
    return f"gk-tenant-a-{tag}", f"gk-tenant-b-{tag}"


def config(redis: str, secret: str, limits: str, ledger: str = "") -> str:
    return CONFIG.format(redis=redis, admin=ADMIN, secret=secret, limits=limits, ledger=ledger)


def post(url: str, secret: str) -> httpx.Response:
    with client(url, secret) as c:
        return c.post("/v1/completions", json=body())


def code(resp: httpx.Response) -> str | None:
    if resp.status_code == 200:
        return None
    found: str = resp.json()["error"]["code"]
    return found


def report(url: str) -> dict[str, Any]:
    with client(url, ADMIN) as c:
        resp = c.get("/admin/usage")
    assert resp.status_code == 200, resp.text
    keys: dict[str, Any] = resp.json()["keys"]
    return keys


def test_same_named_keys_of_two_configs_have_their_own_rate_limits(tmp_path: Path, rds: RedisServer) -> None:
    first, second = secrets()
    with (
        serve_config(tmp_path, config(rds.url, first, RPM)) as a,
        serve_config(tmp_path, config(rds.url, second, RPM)) as b,
        serve_config(tmp_path, config(rds.url, first, RPM)) as c,
    ):
        # One key on two replicas: one bucket, the limit exact across them.
        assert [post(a.url, first).status_code for _ in range(2)] == [200, 200]
        assert post(c.url, first).status_code == 200
        assert code(post(c.url, first)) == "rate_limit_exceeded"
        assert code(post(a.url, first)) == "rate_limit_exceeded"
        # The other gateway's `tenant` has its own bucket, full, and then limited by itself alone.
        assert [post(b.url, second).status_code for _ in range(3)] == [200, 200, 200]
        limited = post(b.url, second)
        assert code(limited) == "rate_limit_exceeded"
        assert limited.headers["x-ratelimit-limit-requests"] == "3"
        assert "for this key" in limited.json()["error"]["message"]
    with rds.client() as r:
        assert r.exists(bucket(first, "rpm")) and r.exists(bucket(second, "rpm"))
        assert not r.exists("rl:{key:tenant}:rpm")


def test_same_named_keys_of_two_configs_have_their_own_budgets_and_usage(tmp_path: Path, rds: RedisServer) -> None:
    """Without a ledger: the day's usage hash (which the daily budget reads) is per identity; each
    gateway's report names its own key `tenant` and the other config's `tenant (<identity>)`."""
    first, second = secrets()
    day = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d")
    with (
        serve_config(tmp_path, config(rds.url, first, BUDGET)) as a,
        serve_config(tmp_path, config(rds.url, second, BUDGET)) as b,
        serve_config(tmp_path, config(rds.url, first, BUDGET)) as c,
        rds.client() as r,
    ):
        assert [post(a.url, first).status_code for _ in range(3)] == [200, 200, 200]
        assert code(post(a.url, first)) == "budget_exceeded"  # its own bookings, still on their way to Redis
        # Once they are there, the key is over its budget on its replica too.
        wait_until(lambda: r.hget(usage(day, first), "requests:demo/long") == "3")
        assert code(post(c.url, first)) == "budget_exceeded"
        assert post(b.url, second).status_code == 200
        wait_until(lambda: r.hget(usage(day, second), "requests:demo/long") == "1")
        ours, theirs = report(a.url), report(b.url)
    assert ours["tenant"]["requests"] == 3 and ours["tenant"]["budget"] == 0.05
    assert ours[f"tenant ({fingerprint(second.encode())})"]["requests"] == 1
    assert theirs[f"tenant ({fingerprint(first.encode())})"]["requests"] == 3
    assert theirs[f"tenant ({fingerprint(first.encode())})"]["budget"] is None  # not this config's key


def test_same_named_keys_of_two_configs_have_their_own_ledger_budgets(tmp_path: Path, rds: RedisServer) -> None:
    """With a ledger: the budget's reservation counter in Redis is per identity. `a` and its replica `c`
    share a ledger; `b` has its own."""
    first, second = secrets()
    day = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d")
    ours = f'ledger: {{url: "sqlite:///{tmp_path / "a.db"}", flush_ms: 100}}\n'
    other = f'ledger: {{url: "sqlite:///{tmp_path / "b.db"}", flush_ms: 100}}\n'
    with (
        serve_config(tmp_path, config(rds.url, first, BUDGET, ours)) as a,
        serve_config(tmp_path, config(rds.url, second, BUDGET, other)) as b,
        serve_config(tmp_path, config(rds.url, first, BUDGET, ours)) as c,
    ):
        assert [post(a.url, first).status_code for _ in range(3)] == [200, 200, 200]
        assert code(post(a.url, first)) == "budget_exceeded"
        assert code(post(c.url, first)) == "budget_exceeded"
        assert [post(b.url, second).status_code for _ in range(3)] == [200, 200, 200]
        assert code(post(b.url, second)) == "budget_exceeded"
    with rds.client() as r:
        assert r.hget(f"budget:key_id:{fingerprint(first.encode())}:{day}", "committed") == str(3 * 17 * 10**9)
        assert r.hget(f"budget:key_id:{fingerprint(second.encode())}:{day}", "committed") == str(3 * 17 * 10**9)
        assert not r.exists(f"budget:key_name:tenant:{day}")
