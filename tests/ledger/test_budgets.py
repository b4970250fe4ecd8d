"""Budgets that concurrent requests cannot overshoot, and that survive a restart of the gateway or of Redis.

A budgeted request reserves its worst case (prompt tokens + max_tokens at the target's price) before the
call and settles its real cost after it. One `body()` on demo/slow-300ms costs 3 prompt tokens at $1000/1M
and 7 completion tokens at $2000/1M, $0.017; the fake answer is held 300 ms, so 20 requests sent together
all arrive before any has ended.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import httpx
import pytest

from tests.helpers.clients import body, client
from tests.helpers.redis import RedisServer
from tests.helpers.servers import GatewayThread
from tests.helpers.waiting import wait_until

from .conftest import query

KEY: Final = "gk-budget-3a9e"
MATE: Final = "gk-budget-mate-71c0"
ENV: Final = {"BUDGET_KEY": KEY, "BUDGET_MATE": MATE}
COST_PICO: Final = 17 * 10**9  # what one body() costs
RESERVED_PICO: Final = 41 * 10**9  # what it reserves: its worst case
BUDGET_PICO: Final = 5 * 10**10  # $0.05
SLOW: Final = "demo/slow-300ms"

CONFIG: Final = """
redis: {{url: "{redis}"}}
logging: {{requests: false}}
retries: {{attempts: 1}}
ledger: {{url: "{url}", flush_ms: {flush_ms}, batch_rows: 1000}}
keys:
  - {{name: capped, key: "${{BUDGET_KEY}}", max_cost_per_day: 0.05, team: blue}}
  - {{name: mate, key: "${{BUDGET_MATE}}", team: blue}}
teams:
  blue: {{max_cost_per_month: {team_month}}}
prices:
  "demo/*": {{prompt_per_1m: 1000, completion_per_1m: 2000}}
providers:
  demo: {{kind: fake, models: [long]}}
"""


def write(tmp_path: Path, redis: str = "", team_month: float = 100.0, flush_ms: int = 100) -> tuple[Path, str]:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    path = tmp_path / "config.yaml"
    path.write_text(CONFIG.format(redis=redis, url=url, team_month=team_month, flush_ms=flush_ms))
    return path, url


async def together(url: str, key: str, n: int) -> list[int]:
    async with httpx.AsyncClient(trust_env=False, timeout=15, headers={"authorization": f"Bearer {key}"}) as c:
        answers = await asyncio.gather(*(c.post(f"{url}/v1/completions", json=body(model=SLOW)) for _ in range(n)))
    return [a.status_code for a in answers]


def spent(url: str, key: str = "capped") -> int:
    return int(query(url, f"SELECT coalesce(sum(cost_pico), 0) FROM requests WHERE key_name = '{key}'")[0][0])


@pytest.fixture(params=["memory", "redis"])
def state(request: pytest.FixtureRequest) -> Iterator[str]:
    yield request.getfixturevalue("rds").url if request.param == "redis" else ""


def test_20_concurrent_first_requests_overshoot_by_at_most_one_worst_case(tmp_path: Path, state: str) -> None:
    path, url = write(tmp_path, state)
    with GatewayThread(path, ENV) as gw:
        statuses = asyncio.run(together(gw.url, KEY, 20))
        # Each reserves its worst case, $0.041: its 11 prompt bytes as 11 tokens, plus 16 a provider may add,
        # and 7 completion tokens. $0 and $0.041 reserved were under $0.05: two admitted, eighteen refused.
        assert sorted(statuses) == [200] * 2 + [429] * 18
        wait_until(lambda: query(url, "SELECT count(*) FROM requests")[0][0] == 20)
    assert spent(url) <= BUDGET_PICO + RESERVED_PICO


def test_spend_survives_a_gateway_restart(tmp_path: Path) -> None:
    path, url = write(tmp_path)
    with GatewayThread(path, ENV) as gw, client(gw.url, KEY) as c:
        for _ in range(3):
            assert c.post("/v1/completions", json=body(model=SLOW)).status_code == 200
    # In-process counters only: a new process knows the day's spend from the ledger alone.
    with GatewayThread(path, ENV) as gw, client(gw.url, KEY) as c:
        resp = c.post("/v1/completions", json=body(model=SLOW))
        assert resp.status_code == 429, resp.text
        assert resp.json()["error"]["code"] == "budget_exceeded"


def test_spend_survives_a_redis_restart(tmp_path: Path, redis: RedisServer) -> None:
    path, url = write(tmp_path, redis.url)
    with GatewayThread(path, ENV) as gw, client(gw.url, KEY) as c:
        for _ in range(3):
            assert c.post("/v1/completions", json=body(model=SLOW)).status_code == 200
        wait_until(lambda: query(url, "SELECT count(*) FROM daily")[0][0] > 0 and spent(url) == 3 * COST_PICO)
        wait_until(lambda: not gw.pipeline.budgets.counters.background)
        redis.restart()  # no persistence: every counter is gone
        wait_until(lambda: c.post("/v1/completions", json=body(model=SLOW)).status_code == 429, timeout=10)


def test_spend_the_writer_has_not_committed_survives_a_redis_restart(tmp_path: Path, redis: RedisServer) -> None:
    # The writer waits a minute: the three rows are still in this process's queue when Redis forgets the
    # counter, so the rebuilt counter must count them from the queue (the rollups have none).
    path, url = write(tmp_path, redis.url, flush_ms=60_000)
    with GatewayThread(path, ENV) as gw, client(gw.url, KEY) as c:
        for _ in range(3):
            assert c.post("/v1/completions", json=body(model=SLOW)).status_code == 200
        wait_until(lambda: not gw.pipeline.budgets.counters.background)
        assert query(url, "SELECT count(*) FROM requests")[0][0] == 0
        redis.restart()  # no persistence: every counter is gone
        statuses: list[int] = []

        def refused() -> bool:
            statuses.append(c.post("/v1/completions", json=body(model=SLOW)).status_code)
            return statuses[-1] == 429

        wait_until(refused, timeout=10)
        assert 200 not in statuses, statuses  # $0.051 spent: the first request after the restart is refused
        assert query(url, "SELECT count(*) FROM requests")[0][0] == 0


def test_a_budget_in_process_memory_counts_what_another_process_booked_since_its_seed(tmp_path: Path) -> None:
    # Two gateways on one ledger, no Redis: each keeps the key's counter in its own memory. B seeds it
    # first; A then spends the rest of the budget. B's counter, seeded again from the ledger while in use
    # (every flush_ms), must count A's spend: one more request of B's (the one that finds its counter due
    # for a seed, admitted on what it held) and then a refusal, where a counter seeded once admits two.
    path, url = write(tmp_path)
    with GatewayThread(path, ENV) as a, GatewayThread(path, ENV) as b:
        with client(b.url, KEY) as cb:
            assert cb.post("/v1/completions", json=body(model=SLOW)).status_code == 200  # B: $0.017
            wait_until(lambda: spent(url) == COST_PICO)
            with client(a.url, KEY) as ca:
                statuses = [ca.post("/v1/completions", json=body(model=SLOW)).status_code for _ in range(3)]
            assert statuses == [200, 200, 429]  # A seeds $0.017: admitted at $0.017 and $0.034
            wait_until(lambda: spent(url) == 3 * COST_PICO)
            time.sleep(0.2)  # past B's flush_ms since its seed
            later = [cb.post("/v1/completions", json=body(model=SLOW)).status_code for _ in range(3)]
    assert later == [200, 429, 429], later
    wait_until(lambda: spent(url) == 4 * COST_PICO)
    assert spent(url) <= BUDGET_PICO + RESERVED_PICO


def test_a_counter_seeded_again_counts_this_processs_own_spend_once(tmp_path: Path) -> None:
    # Each request comes after flush_ms: each admission finds the counter due and seeds it again while the
    # request runs. Its own earlier spend is then in the ledger (or its queue) and in the counter's history:
    # counted once, the budget admits at $0, $0.017 and $0.034 and refuses at $0.051.
    path, url = write(tmp_path)
    statuses = []
    with GatewayThread(path, ENV) as gw, client(gw.url, KEY) as c:
        for _ in range(5):
            time.sleep(0.15)
            statuses.append(c.post("/v1/completions", json=body(model=SLOW)).status_code)
    assert statuses == [200, 200, 200, 429, 429], statuses


def test_a_team_budget_is_shared_by_its_keys(tmp_path: Path) -> None:
    path, url = write(tmp_path, team_month=0.03)
    with GatewayThread(path, ENV) as gw:
        with client(gw.url, MATE) as c:
            assert c.post("/v1/completions", json=body(model=SLOW)).status_code == 200
        with client(gw.url, KEY) as c:
            assert c.post("/v1/completions", json=body(model=SLOW)).status_code == 200
            resp = c.post("/v1/completions", json=body(model=SLOW))
    assert resp.status_code == 429
    message = resp.json()["error"]["message"]
    assert message.startswith(
        "Team 'blue' (key 'capped') has reached its monthly budget of $0.03 ($0.034 spent this month, UTC); "
        "requests resume at "
    ), message


def test_a_keys_budget_counts_its_identity_and_its_rows_from_before_identities(tmp_path: Path) -> None:
    """Rebuilt from the rollups, a key's budget counts its own identity's rows and the rows booked under its
    name before rows named an identity (`key_id` ''), never those of another key named alike."""
    path, url = write(tmp_path)
    with GatewayThread(path, ENV):
        pass  # the ledger's schema, made at start-up
    day = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d")
    insert = (
        "INSERT INTO daily (day, key_name, key_id, team, model, target, requests, errors, prompt_tokens,"
        " completion_tokens, cost_pico, cached) VALUES ('{day}', 'capped', '{ident}', 'blue', 'demo/long',"
        " 'demo/long', 1, 0, 0, 0, {pico}, 0)"
    )
    query(url, insert.format(day=day, ident="", pico=4 * 10**10))  # $0.04 before the upgrade
    query(url, insert.format(day=day, ident="cfg_0000000000000000", pico=10**12))  # another 'capped': $1
    with GatewayThread(path, ENV) as gw, client(gw.url, KEY) as c:
        # $0.04 committed is under $0.05: one more request is admitted, the next refused.
        assert c.post("/v1/completions", json=body(model=SLOW)).status_code == 200
        wait_until(lambda: not gw.pipeline.budgets.counters.background)  # settled
        refused = c.post("/v1/completions", json=body(model=SLOW))
    assert refused.status_code == 429
    assert "($0.057 spent today, UTC)" in refused.json()["error"]["message"]
