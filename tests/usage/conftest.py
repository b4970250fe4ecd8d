"""The usage suite's config and keys, and polling the admin endpoint for bookings.

The fake provider's `demo/long` reports exact usage: prompt_tokens = words in the prompt, completion_tokens
= max_tokens. With the prices below a request of 3 words and max_tokens 7 costs exactly
3 x $1000/1M + 7 x $2000/1M = $0.017, so three of them ($0.051) put the `team` key over its $0.05 budget.
Bookings are written after the answer is sent, so tests poll the admin endpoint for them. The Redis
fixtures (`redis_server`, `rds`) come from tests/conftest.py.
"""

from __future__ import annotations

import time
from typing import Any, Final

from tests.helpers.clients import client

ADMIN_KEY: Final = "adm-usage-5c1e9b"
TEAM_KEY: Final = "gk-usage-team-27f0"
FREE_KEY: Final = "gk-usage-free-88a1"
ENV: Final = {"USAGE_ADMIN_KEY": ADMIN_KEY, "USAGE_TEAM_KEY": TEAM_KEY, "USAGE_FREE_KEY": FREE_KEY}
COST: Final = 0.017  # one `request()` on demo/long

CONFIG: Final = """
redis: {{url: "{redis}"}}
admin: {{key: "${{USAGE_ADMIN_KEY}}"}}
retries: {{attempts: 1}}
cooldown: {{base_ms: 30000, max_ms: 60000, min_requests: 1}}
keys:
  - {{name: team, key: "${{USAGE_TEAM_KEY}}", max_cost_per_day: 0.05, limits: {{tpd: 1000, concurrent: 4}}}}
  - {{name: free, key: "${{USAGE_FREE_KEY}}"}}
prices:
  demo/long: {{prompt_per_1m: 1000, completion_per_1m: 2000}}
  "demo/*": {{prompt_per_1m: 100, completion_per_1m: 100}}
providers:
  demo: {{kind: fake, models: [long, text]}}
  openai: {{kind: openai, api_key: "${{USAGE_UNSET_OPENAI_KEY}}"}}
models:
  - {{name: fast, targets: [{{model: demo/long}}]}}
  - {{name: flaky, strategy: ordered, targets: [{{model: demo/error-503}}]}}
"""


def config(redis_url: str = "") -> str:
    return CONFIG.format(redis=redis_url)


def usage(url: str, day: str | None = None) -> dict[str, Any]:
    with client(url, ADMIN_KEY) as c:
        resp = c.get("/admin/usage", params={"day": day} if day else None)
        assert resp.status_code == 200, resp.text
        data: dict[str, Any] = resp.json()
        return data


def wait_requests(url: str, key: str, requests: int, timeout: float = 5.0) -> dict[str, Any]:
    """The usage report once `key` has `requests` booked today (bookings land just after the answer)."""
    deadline = time.monotonic() + timeout
    while True:
        data = usage(url)
        got = data["keys"].get(key, {}).get("requests", 0)
        if got == requests:
            return data
        assert got < requests, data
        assert time.monotonic() < deadline, f"{key}: {got} requests booked, waited for {requests}: {data}"
        time.sleep(0.02)
