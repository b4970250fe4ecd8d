"""Prices are bounded at load, and one request's cost at `CALL_COST_MAX`, so that no price and no token count
an upstream reports can overflow a ledger row, a rollup or a budget counter (64-bit: about $9.2 million).

A loopback upstream (OpenAI-compatible, as vLLM) reports a trillion prompt and completion tokens at the
dearest price the config takes: each request is booked at the cap, on a real SQLite file and on the suite's
PostgreSQL, with a budgeted key charged through Redis; one WARNING says so.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest
from aiohttp import web

from gateway.config import ConfigError, parse_config
from gateway.limits.prices import CALL_COST_MAX
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
TOKENS: Final = 10**12  # prompt and completion alike, as the upstream reports them

CONFIG: Final = """
{redis}
logging: {{requests: false}}
retries: {{attempts: 1}}
ledger: {{url: "{url}", flush_ms: 100}}
keys:
  - {{name: open, key: "${{PB_KEY}}"}}
  - {{name: budgeted, key: "${{PB_BUDGETED}}", max_cost_per_day: 1000000000}}
prices:
  "llm/*": {{prompt_per_1m: 1000000, completion_per_1m: 1000000}}
providers:
  llm: {{kind: vllm, base_url: "{upstream}/v1", models: [m], discover: false}}
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
    path.write_text(CONFIG.format(redis=shared, url=db_url, upstream=upstream.url))
    caplog.set_level(logging.WARNING, logger="gateway")
    with GatewayThread(path, ENV) as gw:
        for key in (KEY, BUDGETED, KEY, BUDGETED):
            with client(gw.url, key) as c:
                resp = c.post("/v1/completions", json={"model": "llm/m", "prompt": "hi", "max_tokens": 1})
                assert resp.status_code == 200, resp.text
        done = "SELECT count(*) FROM requests"
        wait_until(lambda: query(db_url, done) == [(4,)], timeout=10)
    assert query(db_url, "SELECT DISTINCT cost_pico FROM requests") == [(CALL_COST_MAX,)]
    assert sorted(query(db_url, "SELECT key_name, cost_pico FROM daily")) == [
        ("budgeted", 2 * CALL_COST_MAX),
        ("open", 2 * CALL_COST_MAX),
    ]
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("prices: a request to llm/m")]
    assert len(said) == 1, said
    assert "costs more than one request may be booked at, $576460" in said[0]
    refused = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert refused == []


def _budget_counters(rds: RedisServer) -> list[int]:
    with rds.client() as r:
        return [int(r.hget(name, "committed") or 0) for name in r.scan_iter("budget:key_id:*")]


def test_a_request_past_the_cap_is_booked_at_it_sqlite(
    tmp_path: Path, upstream: Upstream, caplog: pytest.LogCaptureFixture
) -> None:
    _served_at_the_cap(tmp_path, f"sqlite:///{tmp_path / 'ledger.db'}", upstream, "", caplog)


def test_a_request_past_the_cap_is_booked_at_it_postgres_and_redis(
    tmp_path: Path, upstream: Upstream, pg: PostgresServer, rds: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    _served_at_the_cap(tmp_path, pg.url, upstream, rds.url, caplog)
    assert _budget_counters(rds) == [2 * CALL_COST_MAX]  # the budgeted key's day, charged at the cap
