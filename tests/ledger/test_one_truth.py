"""With a ledger, every view of usage is the ledger: `/admin/usage` without a range, its `by=` reports and
the status page's "Usage today" equal what the database holds plus this process's rows not written yet,
after a restart, after a SIGKILL, and on each of two gateways sharing one database.

The gateways are real (uvicorn in threads, or `python -m gateway serve` as a child); the ledger is a real
SQLite file or the suite's PostgreSQL server, read back with the engine's own client library.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from gateway.limits.usage import day_of
from tests.helpers.clients import body, client
from tests.helpers.postgres import PostgresServer
from tests.helpers.servers import GatewayChild, GatewayThread, cli_env
from tests.helpers.waiting import wait_until

from .conftest import ADMIN_KEY, COST_PICO, ENV, SOLO_KEY, TEAM_KEY, config, query

PICO = 10**12


def send(url: str, key: str, n: int) -> None:
    with client(url, key) as c:
        for _ in range(n):
            assert c.post("/v1/completions", json=body()).status_code == 200


def views(url: str) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(the day's books, by team, by model, the status data) as the gateway at `url` shows them."""
    with client(url, ADMIN_KEY) as c:
        day = c.get("/admin/usage").json()
        team = c.get("/admin/usage", params={"by": "team"}).json()
        model = c.get("/admin/usage", params={"by": "model"}).json()
        status = c.get("/admin/status").json()
    return day, team, model, status


def held(url: str, column: str) -> dict[str, tuple[int, int, int, int, float]]:
    """Today's rows in the database per `column`: requests, errors, prompt and completion tokens, cost."""
    found = query(
        url,
        f"SELECT {column}, count(*), sum(CASE WHEN status >= 400 THEN 1 ELSE 0 END), sum(prompt_tokens), "
        f"sum(completion_tokens), sum(cost_pico) FROM requests WHERE day = '{day_of(time.time())}' GROUP BY {column}",
    )
    return {r[0]: (int(r[1]), int(r[2]), int(r[3]), int(r[4]), int(r[5]) / PICO) for r in found}


def shown(report: dict[str, Any], column: str) -> dict[str, tuple[int, int, int, int, float]]:
    return {
        r[column]: (r["requests"], r["errors"], r["prompt_tokens"], r["completion_tokens"], r["cost"])
        for r in report["rows"]
    }


def per_key(day: dict[str, Any]) -> dict[str, tuple[int, int, int, int, float]]:
    return {
        name: (k["requests"], k["errors"], k["prompt_tokens"], k["completion_tokens"], k["cost"])
        for name, k in day["keys"].items()
        if k["requests"]
    }


def assert_views_equal_the_ledger(gw_url: str, db_url: str) -> None:
    day, team, model, status = views(gw_url)
    assert per_key(day) == held(db_url, "key_name")
    assert per_key(status["usage"]) == held(db_url, "key_name")  # the status page's "Usage today"
    assert shown(team, "team") == held(db_url, "team")
    assert shown(model, "model") == held(db_url, "model")


def test_rows_not_written_yet_are_shown_and_a_restart_forgets_nothing(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    path = tmp_path / "config.yaml"
    path.write_text(config(url, flush_ms=60_000))  # nothing is written before the gateway stops
    with GatewayThread(path, ENV) as gw:
        send(gw.url, TEAM_KEY, 3)
        send(gw.url, SOLO_KEY, 2)
        day, team, _, status = views(gw.url)
        assert query(url, "SELECT count(*) FROM requests") == [(0,)]  # all five still queued
    alice, solo = (3, 0, 9, 21, 3 * COST_PICO / PICO), (2, 0, 6, 14, 2 * COST_PICO / PICO)
    assert per_key(day) == {"alice": alice, "solo": solo}
    assert day["keys"]["alice"]["by_model"]["demo/long"]["requests"] == 3
    assert per_key(status["usage"]) == per_key(day)
    assert shown(team, "team") == {"blue": alice, "": solo}
    # The stop wrote every row; a new process shows the same books, read from the ledger.
    assert query(url, "SELECT count(*) FROM requests") == [(5,)]
    with GatewayThread(path, ENV) as gw:
        assert per_key(views(gw.url)[0]) == per_key(day)
        assert_views_equal_the_ledger(gw.url, url)


def test_after_a_sigkill_usage_is_what_the_ledger_holds(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    path = tmp_path / "config.yaml"
    path.write_text(config(url, flush_ms=100))
    env = cli_env(**ENV)
    gw = GatewayChild(path, env=env)
    try:
        gw.wait_ready()
        send(gw.url, TEAM_KEY, 4)
        send(gw.url, SOLO_KEY, 3)
        wait_until(lambda: query(url, "SELECT count(*) FROM requests") == [(7,)])
        assert_views_equal_the_ledger(gw.url, url)
    finally:
        gw.stop()  # SIGKILL: no drain, no last flush
    again = GatewayChild(path, env=env)
    try:
        again.wait_ready()
        day = views(again.url)[0]
        assert per_key(day)["alice"][0] == 4 and per_key(day)["solo"][0] == 3
        assert_views_equal_the_ledger(again.url, url)
        send(again.url, SOLO_KEY, 1)  # and a row of the new process, queued or written, counts once
        assert per_key(views(again.url)[0])["solo"][0] == 4
        wait_until(lambda: query(url, "SELECT count(*) FROM requests") == [(8,)])
        assert_views_equal_the_ledger(again.url, url)
    finally:
        again.stop()


def two_gateways(tmp_path: Path, url: str) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(config(url, flush_ms=100))
    with GatewayThread(path, ENV) as a, GatewayThread(path, ENV) as b:
        send(a.url, TEAM_KEY, 3)
        send(b.url, SOLO_KEY, 2)
        send(b.url, TEAM_KEY, 1)
        with client(a.url) as c:  # refused: booked as an error under `anonymous`, on a only
            assert c.post("/v1/completions", json=body()).status_code == 401
        wait_until(lambda: query(url, "SELECT count(*) FROM requests") == [(7,)])
        for gw in (a, b):
            day = views(gw.url)[0]
            assert per_key(day)["alice"][0] == 4 and per_key(day)["solo"][0] == 2
            assert per_key(day)["anonymous"][:2] == (1, 1)
            assert_views_equal_the_ledger(gw.url, url)


def test_two_gateways_on_one_sqlite_file_show_the_same_books(tmp_path: Path) -> None:
    two_gateways(tmp_path, f"sqlite:///{tmp_path / 'ledger.db'}")


def test_two_gateways_on_one_postgres_show_the_same_books(tmp_path: Path, pg: PostgresServer) -> None:
    two_gateways(tmp_path, pg.url)


@pytest.mark.parametrize("fmt", ["json", "csv"])
def test_a_range_report_counts_rows_still_queued(tmp_path: Path, fmt: str) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    path = tmp_path / "config.yaml"
    path.write_text(config(url, flush_ms=60_000))
    today = day_of(time.time())
    with GatewayThread(path, ENV) as gw:
        send(gw.url, SOLO_KEY, 2)
        with client(gw.url, ADMIN_KEY) as c:
            resp = c.get("/admin/usage", params={"from": today, "by": "key", "format": fmt})
    assert resp.status_code == 200, resp.text
    if fmt == "csv":
        lines = resp.text.splitlines()
        assert lines[0] == "day,key,key_id,requests,errors,prompt_tokens,completion_tokens,cost"
        assert len(lines) == 2 and lines[1].startswith(f"{today},solo,cfg_") and ",2,0,6,14," in lines[1]
    else:
        (row,) = resp.json()["rows"]
        assert row["key"] == "solo" and row["requests"] == 2 and row["key_id"].startswith("cfg_")


def test_runtime_keys_are_listed_with_their_budgets(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    path = tmp_path / "config.yaml"
    path.write_text(config(url, flush_ms=60_000))
    with GatewayThread(path, ENV) as gw:
        with client(gw.url, ADMIN_KEY) as c:
            made = c.post("/admin/keys", json={"name": "ci-bot", "max_cost_per_day": 5}).json()
            c.post("/admin/keys", json={"name": "idle", "max_cost_per_day": 0.5})
        send(gw.url, made["secret"], 2)
        day, _, _, status = views(gw.url)
    for books in (day, status["usage"]):
        assert books["keys"]["ci-bot"]["budget"] == 5 and books["keys"]["ci-bot"]["requests"] == 2
        assert books["keys"]["idle"] == {
            "requests": 0,
            "errors": 0,
            "prompt_tokens": 0,
            "completion_tokens": 0,
            "cost": 0.0,
            "cached": 0,
            "budget": 0.5,
            "by_model": {},
        }
        assert books["keys"]["solo"]["budget"] is None  # a YAML key without one


def test_model_names_a_client_invents_share_one_row_in_every_view(tmp_path: Path) -> None:
    """`demo/invented-<i>` (the fake provider answers any name) is booked under `demo/other` in the rollups,
    as the usage store without a ledger and /metrics name it: queued, committed, and without a ledger alike.
    Each row keeps the name asked for."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    path = tmp_path / "config.yaml"
    path.write_text(config(url, flush_ms=60_000))  # the first views read rows still queued

    def ask(gw_url: str) -> None:
        with client(gw_url, TEAM_KEY) as c:
            for i in range(40):
                assert c.post("/v1/completions", json=body(model=f"demo/invented-{i}")).status_code == 200
            assert c.post("/v1/completions", json=body(model="fast")).status_code == 200

    def by_model(books: dict[str, Any]) -> dict[str, int]:
        return {m: u["requests"] for m, u in books["keys"]["alice"]["by_model"].items()}

    expected = {"demo/other": 40, "fast": 1}
    with GatewayThread(path, ENV) as gw:
        ask(gw.url)
        day, _, model, status = views(gw.url)
        with client(gw.url, ADMIN_KEY) as c:
            target = c.get("/admin/usage", params={"by": "target"}).json()
    for seen in (by_model(day), by_model(status["usage"]), {r["model"]: r["requests"] for r in model["rows"]}):
        assert seen == expected, seen
    assert {r["target"]: r["requests"] for r in target["rows"]} == {"demo/other": 40, "demo/long": 1}
    # Committed at the stop: the rollups hold the buckets, the rows the names asked for.
    assert sorted(query(url, "SELECT model, target, requests FROM daily")) == [
        ("demo/other", "demo/other", 40),
        ("fast", "demo/long", 1),
    ]
    assert query(url, "SELECT count(DISTINCT model) FROM requests") == [(41,)]
    with GatewayThread(path, ENV) as gw:
        day, _, model, status = views(gw.url)
    assert by_model(day) == by_model(status["usage"]) == expected
    # Without a ledger, the usage store's view is the same.
    plain = tmp_path / "plain.yaml"
    plain.write_text("\n".join(line for line in config(url).splitlines() if not line.startswith("ledger:")))
    with GatewayThread(plain, ENV) as gw:
        ask(gw.url)
        day, _, _, status = views(gw.url)
    assert by_model(day) == by_model(status["usage"]) == expected
