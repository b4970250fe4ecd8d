"""`GET /admin/usage` over any range of days from the ledger, by key, team, model or target, as JSON or CSV;
and the status data's spend per day. The rows are planted on three days; one request is served today."""

from __future__ import annotations

import functools
import time
from pathlib import Path

from gateway.ledger.engine import Database
from gateway.ledger.replay import commit
from gateway.limits.usage import day_of
from tests.helpers.clients import body, client
from tests.helpers.servers import GatewayThread
from tests.helpers.waiting import wait_until

from .conftest import ADMIN_KEY, COST_PICO, ENV, SOLO_KEY, config, query


def plant(url: str) -> list[str]:
    db = Database(url)
    days = [day_of(time.time() - ago * 86_400) for ago in (3, 2, 1)]
    rows = [
        (f"p{i}", f"r{i}", 0.0, day, key, team, "fast", "demo/long", "demo", "openai", 0, status, None, 1.0, 1.0)
        + (3, 7, COST_PICO, None, 1, None, None)
        for i, (day, key, team, status) in enumerate(
            [(days[0], "alice", "blue", 200), (days[1], "alice", "blue", 200), (days[1], "bob", "blue", 200)]
            + [(days[2], "solo", "", 200), (days[2], "solo", "", 500)]
        )
    ]
    try:
        db.migrate()
        db.transaction(functools.partial(commit, rows=rows, db=db))
    finally:
        db.close()
    return days


def test_usage_over_a_range(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    days = plant(url)
    path = tmp_path / "config.yaml"
    path.write_text(config(url))
    today = day_of(time.time())
    with GatewayThread(path, ENV) as gw:
        with client(gw.url, SOLO_KEY) as c:
            assert c.post("/v1/completions", json=body()).status_code == 200
        wait_until(lambda: query(url, "SELECT count(*) FROM requests")[0][0] == 6)
        with client(gw.url, ADMIN_KEY) as c:
            by_team = c.get("/admin/usage", params={"from": days[0], "to": today, "by": "team"}).json()
            csv = c.get("/admin/usage", params={"from": days[1], "to": days[1], "by": "key", "format": "csv"})
            bad = c.get("/admin/usage", params={"from": days[0], "by": "colour"})
            backwards = c.get("/admin/usage", params={"from": today, "to": days[0]})
            status = c.get("/admin/status").json()
            day_only = c.get("/admin/usage").json()  # without a range: today's books, as without a ledger
    cost = COST_PICO / 10**12
    assert by_team["rows"] == [
        {
            "day": days[0],
            "team": "blue",
            "requests": 1,
            "errors": 0,
            "prompt_tokens": 3,
            "completion_tokens": 7,
            "cost": cost,
        },
        {
            "day": days[1],
            "team": "blue",
            "requests": 2,
            "errors": 0,
            "prompt_tokens": 6,
            "completion_tokens": 14,
            "cost": 2 * cost,
        },
        {
            "day": days[2],
            "team": "",
            "requests": 2,
            "errors": 1,
            "prompt_tokens": 6,
            "completion_tokens": 14,
            "cost": 2 * cost,
        },
        {
            "day": today,
            "team": "",
            "requests": 1,
            "errors": 0,
            "prompt_tokens": 3,
            "completion_tokens": 7,
            "cost": cost,
        },
    ]
    assert by_team["totals"]["requests"] == 6 and by_team["totals"]["cost"] == 6 * cost
    assert csv.headers["content-type"].startswith("text/csv")
    assert csv.text == (
        "day,key,key_id,requests,errors,prompt_tokens,completion_tokens,cost\n"
        f"{days[1]},alice,,1,0,3,7,{cost}\n{days[1]},bob,,1,0,3,7,{cost}\n"
    )
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "by"
    assert backwards.status_code == 400 and backwards.json()["error"]["param"] == "to"
    # Every one of the last 30 days, oldest first; a day with nothing booked as zeros.
    spend = status["spend_per_day"]
    assert len(spend) == 30 and [d["day"] for d in spend[-4:]] == [*days, today]
    assert spend[-3] == {"day": days[1], "cost": 2 * cost, "requests": 2}
    assert spend[0] == {"day": day_of(time.time() - 29 * 86_400), "cost": 0.0, "requests": 0}
    assert day_only["day"] == today and "solo" in day_only["keys"]
