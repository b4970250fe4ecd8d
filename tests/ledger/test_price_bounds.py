"""Prices are bounded at load, and one request's cost at `CALL_COST_MAX`, so that no price and no token count
an upstream reports can overflow a ledger row; a day's rollup and a budget's Redis counter stop at the
largest 64-bit integer (about $9.2 million) instead of overflowing.

A loopback upstream (OpenAI-compatible, as vLLM) reports a trillion prompt and completion tokens at the
dearest price the config takes: each request is booked at the cap, on a real SQLite file and on the suite's
PostgreSQL, with a budgeted key charged through Redis; one WARNING says so. More than 16 such requests take
one key's day past 64 bits: every row is still booked.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest
from aiohttp import web

from gateway.config import ConfigError, parse_config
from gateway.ledger.batch import COST_SUM_MAX
from gateway.limits.prices import CALL_COST_MAX
from gateway.limits.usage import FLUSH_S
from tests.helpers.clients import client
from tests.helpers.postgres import PostgresServer
from tests.helpers.redis import RedisServer
from tests.helpers.servers import GatewayThread
from tests.helpers.upstreams import Received, Upstream
from tests.helpers.waiting import wait_until

from .conftest import query

KEY: Final = "gk-price-bounds-4c1a"
BUDGETED: Final = "gk-price-bounds-budget-77e0"
ENV: Final = {"PB_KEY": KEY, "PB_BUDGETED": BUDGETED}
TOKENS: Final = 10**12  # prompt and completion alike, as the upstream reports them (the gateway reads 10**8)
BEYOND: Final = 2**63 // CALL_COST_MAX + 2  # requests at the cap whose sum is past a 64-bit integer

CONFIG: Final = """
{redis}
logging: {{requests: false}}
retries: {{attempts: 1}}
{ledger}
keys:
  - {{name: open, key: "${{PB_KEY}}"}}
  - {{name: budgeted, key: "${{PB_BUDGETED}}", max_cost_per_day: 1000000000, team: t}}
teams: {{t: {{max_cost_per_month: 1000000000}}}}
prices:
  "llm/*": {{prompt_per_1m: 1000000, completion_per_1m: 1000000}}
providers:
  llm: {{kind: vllm, base_url: "{upstream}/v1", models: [m, n], discover: false}}
"""


@pytest.mark.parametrize(
    ("price", "problem"),
    [
        ("-0.5", "prices.llm/*.completion_per_1m: Expected `float` >= 0.0"),
        ("1000000.5", "prices.llm/*.completion_per_1m: Expected `float` <= 1000000.0"),
        ("1.0e+303", "prices.llm/*.completion_per_1m: Expected `float` <= 1000000.0"),
        (".inf", "prices.llm/*.completion_per_1m: must be a finite number, got .inf"),
    ],
)
def test_a_price_out_of_bounds_fails_the_load_in_one_line(price: str, problem: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(f"prices: {{'llm/*': {{completion_per_1m: {price}}}}}", "gw.yaml", {})
    assert str(info.value) == f"gw.yaml: {problem}"
    parse_config("prices: {'llm/*': {prompt_per_1m: 1000000, completion_per_1m: 0}}", "gw.yaml", {})


async def _huge_usage(request: web.Request, received: Received) -> web.StreamResponse:
    usage = {"prompt_tokens": TOKENS, "completion_tokens": TOKENS, "total_tokens": 2 * TOKENS}
    choice = {"index": 0, "text": " x", "finish_reason": "length", "logprobs": None}
    body = {"id": "c", "object": "text_completion", "created": 1, "model": "m", "choices": [choice], "usage": usage}
    return web.json_response(body)


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    with Upstream() as up:
        up.handler = _huge_usage
        yield up


def _served_at_the_cap(
    tmp_path: Path, db_url: str, upstream: Upstream, redis: str, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "config.yaml"
    shared = f'redis: {{url: "{redis}"}}' if redis else ""
    ledger = f'ledger: {{url: "{db_url}", flush_ms: 100}}' if db_url else ""
    path.write_text(CONFIG.format(redis=shared, ledger=ledger, upstream=upstream.url))
    caplog.set_level(logging.WARNING, logger="gateway")
    with GatewayThread(path, ENV) as gw:
        # 2 requests of one key, and more than 16 of the other's: their day's spend is past what 64 bits hold.
        for key in [KEY] * 2 + [BUDGETED] * BEYOND:
            with client(gw.url, key) as c:
                resp = c.post("/v1/completions", json={"model": "llm/m", "prompt": "hi", "max_tokens": 1})
                assert resp.status_code == 200, resp.text
        if db_url:
            done = "SELECT count(*) FROM requests"
            wait_until(lambda: query(db_url, done) == [(2 + BEYOND,)], timeout=10)
        else:
            time.sleep(3 * FLUSH_S)  # the usage counters reach Redis every FLUSH_S
    if db_url:
        assert query(db_url, "SELECT DISTINCT cost_pico FROM requests") == [(CALL_COST_MAX,)]
        # Every row booked; the rollup that would overflow stops at the largest 64-bit integer.
        assert sorted(query(db_url, "SELECT key_name, cost_pico FROM daily")) == [
            ("budgeted", COST_SUM_MAX),
            ("open", 2 * CALL_COST_MAX),
        ]
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("prices: a request to llm/m")]
    assert len(said) == 1, said
    assert "costs more than one request may be booked at, $576460" in said[0]
    # No row refused by the database, and no Redis error taken for an outage.
    troubles = [r.getMessage() for r in caplog.records if "refused" in r.getMessage() or "redis" in r.getMessage()]
    assert troubles == []


def _budget_counters(rds: RedisServer) -> list[int]:
    with rds.client() as r:
        return [int(r.hget(name, "committed") or 0) for name in r.scan_iter("budget:key_id:*")]


def _spend(rds: RedisServer) -> list[int]:
    """Every usage counter's day total (per key identity) and every spend counter (without a ledger: each
    key's month, the team's day and month), smallest first."""
    with rds.client() as r:
        out = [int(r.hget(name, "cost_pico") or 0) for name in r.scan_iter("usage:*")]
        out += [int(r.get(name) or 0) for name in r.scan_iter("spend:*")]
    return sorted(out)


def test_a_request_past_the_cap_is_booked_at_it_sqlite(
    tmp_path: Path, upstream: Upstream, caplog: pytest.LogCaptureFixture
) -> None:
    _served_at_the_cap(tmp_path, f"sqlite:///{tmp_path / 'ledger.db'}", upstream, "", caplog)


def test_a_request_past_the_cap_is_booked_at_it_postgres_and_redis(
    tmp_path: Path, upstream: Upstream, pg: PostgresServer, rds: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    _served_at_the_cap(tmp_path, pg.url, upstream, rds.url, caplog)
    assert _budget_counters(rds) == [COST_SUM_MAX]  # the budgeted key's day: as far as the counter goes


def test_usage_and_spend_counters_past_64_bits_without_a_ledger(
    tmp_path: Path, upstream: Upstream, rds: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Without a ledger the usage counters hold the spend budgets read: they stop at 64 bits as well, and
    Redis stays the shared state (an overflow's error would have made every write of the flush fail)."""
    _served_at_the_cap(tmp_path, "", upstream, rds.url, caplog)
    # The open key's day and month (2 requests); the budgeted key's day and month, its team's day and month.
    assert _spend(rds) == [2 * CALL_COST_MAX] * 2 + [COST_SUM_MAX] * 4


def test_a_budget_seeded_past_64_bits_stops_at_them(
    tmp_path: Path, upstream: Upstream, pg: PostgresServer, rds: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Two saturated rollups of one key's day sum past 64 bits: a counter Redis lost is seeded at the bound,
    not refused by HINCRBY (which made Redis look unreachable to every replica)."""
    path = tmp_path / "config.yaml"
    ledger = f'ledger: {{url: "{pg.url}", flush_ms: 100}}'
    path.write_text(CONFIG.format(redis=f'redis: {{url: "{rds.url}"}}', ledger=ledger, upstream=upstream.url))
    caplog.set_level(logging.WARNING, logger="gateway")
    with GatewayThread(path, ENV) as gw, client(gw.url, BUDGETED) as c:
        for model in ("llm/m", "llm/n"):
            for _ in range(BEYOND):
                resp = c.post("/v1/completions", json={"model": model, "prompt": "hi", "max_tokens": 1})
                assert resp.status_code == 200, resp.text
        wait_until(lambda: query(pg.url, "SELECT count(*) FROM requests") == [(2 * BEYOND,)], timeout=10)
        assert query(pg.url, "SELECT sum(cost_pico) FROM daily") == [(2 * COST_SUM_MAX,)]
        with rds.client() as r:
            r.flushall()  # Redis lost the counters: the next request seeds them from the ledger
        resp = c.post("/v1/completions", json={"model": "llm/m", "prompt": "hi", "max_tokens": 1})
        assert resp.status_code == 200, resp.text
        wait_until(lambda: _budget_counters(rds) == [COST_SUM_MAX], timeout=5)
    assert [r.getMessage() for r in caplog.records if "redis" in r.getMessage()] == []
