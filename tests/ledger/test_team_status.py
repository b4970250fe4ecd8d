"""`GET /admin/status` for a team's admin key: its team's part of the operator's view, nothing of another's.

Over real sockets, on a real SQLite ledger file: `blue` and `green` each have an admin, keys in the YAML and
runtime keys their admins made, rate limits of their own and of their keys, `models` that reach different
targets, and a running batch; a key of no team does the same. Each team admin reads its team's usage, spend,
buckets (with their headroom), batches and reachable targets' health, and none of the other team's, of the key
of no team, or of what the operator alone sees (providers, reasons naming variables, fleets, queues, cache).
The operator's view keeps its fields and buckets. Rates are per minute and small, so nothing refills while
the test runs and every headroom is exact.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import pytest

from gateway.limits.usage import day_of
from tests.helpers.clients import body, client, slow_batch
from tests.helpers.servers import GatewayThread
from tests.helpers.waiting import wait_until

ADMIN: Final = "adm-ts-op-3f7a"
BLUE_ADMIN: Final = "adm-ts-blue-81c2"
GREEN_ADMIN: Final = "adm-ts-green-4d90"
ALICE: Final = "gk-ts-alice-0b6e"
GINA: Final = "gk-ts-gina-72f1"
SOLO: Final = "gk-ts-solo-a93c"
ENV: Final = {
    "TS_ADMIN": ADMIN,
    "TS_BLUE_ADMIN": BLUE_ADMIN,
    "TS_GREEN_ADMIN": GREEN_ADMIN,
    "TS_ALICE": ALICE,
    "TS_GINA": GINA,
    "TS_SOLO": SOLO,
}

CONFIG: Final = """
admin: {{key: "${{TS_ADMIN}}"}}
logging: {{requests: false}}
retries: {{attempts: 1}}
ledger: {{url: "{url}", flush_ms: 100, keys_poll_ms: 200}}
batches: {{poll_ms: 100, concurrency: 1}}
keys:
  - {{name: alice, key: "${{TS_ALICE}}", team: blue, limits: {{rpm: 3}}}}
  - {{name: gina, key: "${{TS_GINA}}", team: green, limits: {{rpm: 6}}}}
  - {{name: solo, key: "${{TS_SOLO}}", limits: {{rpm: 9}}}}
teams:
  blue: {{admin_key: "${{TS_BLUE_ADMIN}}", limits: {{rpm: 4}}, models: [fast, slower]}}
  green: {{admin_key: "${{TS_GREEN_ADMIN}}", limits: {{rpm: 7}}, models: [other]}}
prices:
  demo/long: {{prompt_per_1m: 1000, completion_per_1m: 2000}}
providers:
  demo: {{kind: fake, models: [long, text, slow-400ms]}}
  far: {{kind: fake, models: [slow-400ms]}}
  gone: {{kind: openai, api_key: "${{TS_UNSET_KEY}}"}}
models:
  - {{name: fast, targets: [{{model: demo/long}}], fallbacks: [gone/gpt-4o], limits: {{rpm: 1000}}}}
  - {{name: slower, targets: [{{model: demo/slow-400ms}}]}}
  - {{name: other, targets: [{{model: far/slow-400ms}}]}}
"""

OPERATOR_FIELDS: Final = {
    "time",
    "redis",
    "ledger",
    "providers",
    "aliases",
    "targets",
    "limits",
    "usage",
    "cache",
    "spend_per_day",
    "fleets",
    "queues",
    "batches",
}
TEAM_FIELDS: Final = {"time", "team", "redis", "ledger", "aliases", "targets", "limits", "usage", "spend_per_day"}


@pytest.fixture
def gw(tmp_path: Path) -> Iterator[GatewayThread]:
    path = tmp_path / "config.yaml"
    path.write_text(CONFIG.format(url=f"sqlite:///{tmp_path / 'ledger.db'}"))
    with GatewayThread(path, ENV) as g:
        yield g


def status(gw: GatewayThread, key: str) -> dict[str, Any]:
    with client(gw.url, key) as c:
        resp = c.get("/admin/status")
    assert resp.status_code == 200, resp.text
    assert resp.headers["cache-control"] == "no-store"
    found: dict[str, Any] = resp.json()
    return found


def made(gw: GatewayThread, admin: str, name: str, rpm: int) -> str:
    with client(gw.url, admin) as c:
        resp = c.post("/admin/keys", json={"name": name, "limits": {"rpm": rpm}})
    assert resp.status_code == 201, resp.text
    return str(resp.json()["secret"])


def batch(gw: GatewayThread, key: str, model: str) -> str:
    """A batch of 20 slow lines (8 s at one line at a time) by `key`: its id."""
    return slow_batch(gw.url, key, model)


def limits(view: dict[str, Any]) -> set[tuple[str, str, int, int]]:
    return {(b["scope"], b["kind"], b["limit"], b["remaining"]) for b in view["limits"]}


def today(view: dict[str, Any]) -> int:
    return int(next(d for d in view["spend_per_day"] if d["day"] == day_of(time.time()))["requests"])


def test_a_team_admin_sees_its_teams_status_only(gw: GatewayThread) -> None:
    b1 = made(gw, BLUE_ADMIN, "bot-b", 2)
    g1 = made(gw, GREEN_ADMIN, "bot-g", 5)
    for key, model in ((ALICE, "fast"), (b1, "fast"), (GINA, "other"), (g1, "other"), (SOLO, "fast")):
        with client(gw.url, key) as c:
            assert c.post("/v1/completions", json=body(model=model)).status_code == 200, key
    wait_until(lambda: today(status(gw, ADMIN)) == 5, timeout=10)

    blue, green, operator = status(gw, BLUE_ADMIN), status(gw, GREEN_ADMIN), status(gw, ADMIN)
    assert set(blue) == TEAM_FIELDS | {"batches"} and blue["team"] == "blue"
    assert set(operator) == OPERATOR_FIELDS

    # Usage and spend: the team's keys' rows, YAML and runtime, and no one else's.
    assert sorted(blue["usage"]["keys"]) == ["alice", "bot-b"]
    assert sorted(green["usage"]["keys"]) == ["bot-g", "gina"]
    # the operator tells two teams' runtime keys of one name apart: `team/name`
    assert sorted(operator["usage"]["keys"]) == ["alice", "blue/bot-b", "gina", "green/bot-g", "solo"]
    assert (today(blue), today(green), today(operator)) == (2, 2, 5)
    assert len(blue["spend_per_day"]) == 30

    # Buckets: the team's own and its keys' own, each charged once by its one request (nothing refills at these
    # rates while the test runs); not the alias's, another team's or another key's.
    assert limits(blue) == {("team:blue", "rpm", 4, 2), ("key:alice", "rpm", 3, 2), ("key:blue/bot-b", "rpm", 2, 1)}
    assert limits(green) == {("team:green", "rpm", 7, 5), ("key:gina", "rpm", 6, 5), ("key:green/bot-g", "rpm", 5, 4)}
    assert {b["scope"] for b in operator["limits"]} == {
        "key:alice",
        "key:gina",
        "key:solo",
        "team:blue",
        "team:green",
        "model:fast",
    }

    # Targets its `models` reach (an alias's targets and fallbacks), their health only.
    assert [a["name"] for a in blue["aliases"]] == ["fast", "slower"]
    assert [a["name"] for a in green["aliases"]] == ["other"]
    assert [t["target"] for t in blue["targets"]] == ["demo/long", "gone/gpt-4o", "demo/slow-400ms"]
    assert [t["target"] for t in green["targets"]] == ["far/slow-400ms"]
    assert all(set(t) == {"target", "state", "cooling_ms", "cause", "failures"} for t in blue["targets"])
    assert {t["target"]: t["state"] for t in blue["targets"]}["gone/gpt-4o"] == "unavailable"
    shown = {t["target"]: t for t in operator["targets"]}
    assert "TS_UNSET_KEY" in shown["gone/gpt-4o"]["reason"]  # the operator is told why
    assert {"demo/text", "far/slow-400ms"} <= set(shown)
    assert blue["ledger"] == "ok" and blue["redis"] == "disabled"

    # Running batches: its team's keys' alone.
    mine, theirs, solos = batch(gw, ALICE, "slower"), batch(gw, GINA, "other"), batch(gw, SOLO, "slower")
    blue, green, operator = status(gw, BLUE_ADMIN), status(gw, GREEN_ADMIN), status(gw, ADMIN)
    assert [(b["id"], b["owner"]) for b in blue["batches"]] == [(mine, "alice")]
    assert [(b["id"], b["owner"]) for b in green["batches"]] == [(theirs, "gina")]
    assert {b["id"] for b in operator["batches"]} == {mine, theirs, solos}
    # Nothing of another team, of the key of no team, or of the variables the operator's reasons name.
    for view, others in ((blue, ("gina", "bot-g", "far/", "other")), (green, ("alice", "bot-b", "demo/", "fast"))):
        text = json.dumps(view)
        assert not [w for w in (*others, "solo", "TS_UNSET_KEY", "model:") if w in text], text
    with client(gw.url, ADMIN) as c:
        for batch_id in (mine, theirs, solos):
            assert c.post(f"/admin/batches/{batch_id}/cancel").status_code == 200


def test_a_client_key_is_no_admin_key_on_the_status(gw: GatewayThread) -> None:
    for key in (ALICE, SOLO, None, "not-a-key"):
        with client(gw.url, key) as c:
            resp = c.get("/admin/status")
        assert resp.status_code == 401, (key, resp.text)
        assert resp.json()["error"]["type"] == "authentication_error"
