"""Monthly and team budgets without a ledger: `keys[].max_cost_per_month` and `teams:` are checked, like a
key's daily budget, against the spend already booked (in Redis, or in process memory without it).

Served by the real gateway (uvicorn in a thread), with a real redis-server and without Redis. One `body()`
on demo/long costs $0.017 (tests/usage/conftest.py).
"""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest

from gateway.limits.usage import day_of, next_month, to_midnight
from tests.helpers.clients import body, client
from tests.helpers.servers import GatewayThread, rewrite
from tests.helpers.waiting import wait_until

from .conftest import ADMIN_KEY, wait_requests

KEYS: Final = {"A": "gk-red-a-51f0", "B": "gk-red-b-0c3e", "M": "gk-month-7e21", "S": "gk-blue-2d88"}
ENV: Final[dict[str, str]] = {}  # the keys are written out: a reload reads the file with the process's environment

CONFIG: Final = """
redis: {{url: "{redis}"}}
admin: {{key: "{admin}"}}
retries: {{attempts: 1}}
keys:
  - {{name: red-a, key: "{A}", team: red}}
  - {{name: red-b, key: "{B}", team: red}}
  - {{name: monthly, key: "{M}", max_cost_per_month: 0.03}}
  - {{name: blue-solo, key: "{S}", team: blue}}
teams:
  red: {{max_cost_per_day: 0.03}}
  blue: {{max_cost_per_month: 0.02}}
prices:
  demo/long: {{prompt_per_1m: 1000, completion_per_1m: 2000}}
providers:
  demo: {{kind: fake, models: [long]}}
"""


@pytest.fixture(params=["memory", "redis"])
def setup(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Path, str]]:
    url = request.getfixturevalue("rds").url if request.param == "redis" else ""
    path = tmp_path / "config.yaml"
    path.write_text(CONFIG.format(redis=url, admin=ADMIN_KEY, **KEYS))
    yield path, url


def post(url: str, key: str) -> tuple[int, dict[str, str], str]:
    with client(url, KEYS[key]) as c:
        resp = c.post("/v1/completions", json=body())
    return resp.status_code, dict(resp.headers), resp.text


def refusal(url: str, key: str) -> tuple[str, int]:
    status, headers, text = post(url, key)
    assert status == 429, text
    error = json.loads(text)["error"]  # the same answer as the header: both say the same second
    assert error["code"] == "budget_exceeded"
    return error["message"], int(headers["retry-after"])


def to_next_month(now: float) -> int:
    first = next_month(day_of(now))
    return int(dt.datetime(first.year, first.month, 1, tzinfo=dt.UTC).timestamp() - now)


def test_a_teams_daily_budget_is_shared_by_its_keys(setup: tuple[Path, str]) -> None:
    path, _ = setup
    with GatewayThread(path, ENV) as gw:
        assert post(gw.url, "A")[0] == 200
        assert post(gw.url, "B")[0] == 200  # $0.034 for the team, each key $0.017
        wait_requests(gw.url, "red-b", 1)
        wait_until(lambda: post(gw.url, "A")[0] == 429, timeout=3)  # booked a moment after the answer
        message, wait = refusal(gw.url, "B")
        assert message == (
            f"Team 'red' (key 'red-b') has reached its daily budget of $0.03 ($0.034 spent today, UTC); "
            f"requests resume at 00:00 UTC, in {wait} s"
        )
        assert abs(wait - to_midnight(time.time())) <= 2
        assert post(gw.url, "M")[0] == 200  # other keys, other teams: not affected


def test_a_keys_monthly_budget_and_a_teams(setup: tuple[Path, str]) -> None:
    path, url = setup
    with GatewayThread(path, ENV, poll_every=0.1) as gw:
        for key in ("M", "S"):
            assert post(gw.url, key)[0] == 200
            assert post(gw.url, key)[0] == 200  # $0.017 booked: under both budgets
        wait_requests(gw.url, "blue-solo", 2)
        wait_until(lambda: post(gw.url, "M")[0] == 429, timeout=3)
        message, wait = refusal(gw.url, "M")
        first = next_month(day_of(time.time())).isoformat()
        assert message == (
            f"Key 'monthly' has reached its monthly budget of $0.03 ($0.034 spent this month, UTC); "
            f"requests resume at {first} 00:00 UTC, in {wait} s"
        )
        assert abs(wait - to_next_month(time.time())) <= 2
        message, _ = refusal(gw.url, "S")
        assert message.startswith("Team 'blue' (key 'blue-solo') has reached its monthly budget of $0.02 ($0.034")

        # A reload keeps the counters (the process's, or Redis's).
        reloaded = gw.pipeline
        rewrite(path, path.read_text() + "# edited\n")
        wait_until(lambda: gw.pipeline is not reloaded, timeout=6)
        assert post(gw.url, "M")[0] == 429 and post(gw.url, "S")[0] == 429
    if url:
        # With Redis the month's spend outlives the process: a new gateway still refuses.
        with GatewayThread(path, ENV) as gw:
            assert post(gw.url, "M")[0] == 429 and post(gw.url, "S")[0] == 429
            assert post(gw.url, "A")[0] == 200
