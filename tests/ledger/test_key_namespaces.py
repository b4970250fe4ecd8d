"""Key names are per team: each team's keys (YAML and runtime) are a namespace of their own, and the
operator's keys of no team, with every YAML key, one more (gateway/ledger/namespaces.py).

Over real sockets, on a real SQLite file and on PostgreSQL: two teams' admins each make a key `ci` and the
operator one of no team; a name taken within its namespace is a 409 that names nothing of another team's;
each key books its own rows, a team admin reads only its own `ci` and the operator tells the three apart
(`blue/ci`, `green/ci`, `ci`). A team admin's key may take a YAML key's name of another team, and gets none
of that YAML key's budget or priority. A ledger made before names were per team keeps its keys through the upgrade.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Any, Final

import pytest

from gateway.config import ConfigError, load_config
from gateway.ledger.engine import Cursor, Database
from gateway.ledger.schema import MIGRATIONS
from gateway.limits.usage import day_of
from tests.helpers.clients import body, client
from tests.helpers.postgres import PostgresServer
from tests.helpers.servers import GatewayThread

from .conftest import ADMIN_KEY, TEAM_KEY, config, query
from .test_team_admins import BLUE_ADMIN, GREEN_ADMIN, TEAM_ENV, TEAMS, WITH_ADMINS, call, make

# Before names were per team: a runtime key's name was unique across the whole table.
PER_TEAM_SINCE: Final = 10


def gateway_config(tmp_path: Path, url: str, yaml_alice: str = "team: blue") -> Path:
    text = config(url, extra=f', spill_dir: "{tmp_path / "spill"}"').replace(TEAMS, WITH_ADMINS)
    # A server with `max_concurrency` turns the priority header on: whose `max_priority` holds shows.
    text = text.replace("models: [long, text]}", "models: [long, text], max_concurrency: 4}")
    path = tmp_path / "config.yaml"
    path.write_text(text.replace("team: blue}", yaml_alice + "}"))
    return path


def completions(gw: GatewayThread, secret: str) -> int:
    with client(gw.url, secret) as c:
        return int(c.post("/v1/completions", json=body()).status_code)


def by_key(gw: GatewayThread, admin: str) -> dict[str, int]:
    today = day_of(time.time())
    rows = call(gw, admin, "GET", "/admin/usage", params={"from": today, "by": "key"}).json()["rows"]
    return {r["key"]: r["requests"] for r in rows}


def day_view(gw: GatewayThread, admin: str) -> dict[str, int]:
    return {name: k["requests"] for name, k in call(gw, admin, "GET", "/admin/usage").json()["keys"].items()}


def shared_names(gw: GatewayThread, url: str) -> None:
    blue = make(gw, BLUE_ADMIN, name="ci")
    green = make(gw, GREEN_ADMIN, name="ci")
    own = make(gw, ADMIN_KEY, name="ci")
    assert [r.status_code for r in (blue, green, own)] == [201, 201, 201], (blue.text, green.text, own.text)
    assert (blue.json()["key"]["team"], green.json()["key"]["team"], own.json()["key"]["team"]) == (
        "blue",
        "green",
        None,
    )
    # Taken within its namespace; the refusal names that namespace alone.
    for admin, spec, where in (
        (BLUE_ADMIN, {}, " in team 'blue'"),
        (ADMIN_KEY, {}, ""),
        (ADMIN_KEY, {"team": "green"}, " in team 'green'"),
    ):
        taken = make(gw, admin, name="ci", **spec)
        assert taken.status_code == 409, (spec, taken.text)
        error = taken.json()["error"]
        assert (error["code"], error["param"]) == ("key_exists", "name")
        assert error["message"] == f"a key named 'ci' exists already{where}", error
    assert query(url, "SELECT count(*) FROM api_keys WHERE name = 'ci'") == [(3,)]

    for secret, times in ((blue.json()["secret"], 2), (green.json()["secret"], 1), (own.json()["secret"], 3)):
        for _ in range(times):
            assert completions(gw, secret) == 200
    blue_id = blue.json()["key"]["id"]
    assert [k["id"] for k in call(gw, BLUE_ADMIN, "GET", "/admin/keys").json()["keys"]] == [blue_id]

    # Each team admin reads its own `ci` alone, by its name; the operator tells the three apart.
    assert by_key(gw, BLUE_ADMIN) == {"ci": 2}
    assert by_key(gw, GREEN_ADMIN) == {"ci": 1}
    assert day_view(gw, BLUE_ADMIN) == {"alice": 0, "ci": 2}
    assert day_view(gw, GREEN_ADMIN) == {"ci": 1}
    assert by_key(gw, ADMIN_KEY) == {"blue/ci": 2, "green/ci": 1, "ci": 3}
    assert day_view(gw, ADMIN_KEY) == {"alice": 0, "solo": 0, "blue/ci": 2, "green/ci": 1, "ci": 3}

    # Revoked, a key keeps its name in its team: another team's is untouched.
    assert call(gw, BLUE_ADMIN, "DELETE", f"/admin/keys/{blue_id}").status_code == 200
    assert make(gw, BLUE_ADMIN, name="ci").status_code == 409
    assert completions(gw, green.json()["secret"]) == 200


def test_two_teams_each_have_a_key_named_alike(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    with GatewayThread(gateway_config(tmp_path, url), TEAM_ENV) as gw:
        shared_names(gw, url)


def test_two_teams_each_have_a_key_named_alike_on_postgres(tmp_path: Path, pg: PostgresServer) -> None:
    with GatewayThread(gateway_config(tmp_path, pg.url), TEAM_ENV) as gw:
        shared_names(gw, pg.url)


def test_a_yaml_keys_name_is_taken_in_its_own_namespace_only(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    # The YAML `alice` (blue) has a daily budget below one request's cost: its requests are soon refused.
    path = gateway_config(tmp_path, url, yaml_alice="team: blue, max_cost_per_day: 0.001")
    with GatewayThread(path, TEAM_ENV) as gw:
        for admin in (BLUE_ADMIN, ADMIN_KEY):  # blue's namespace, and the operator's own
            taken = make(gw, admin, name="alice")
            assert taken.status_code == 409 and taken.json()["error"]["code"] == "key_exists", taken.text
        green = make(gw, GREEN_ADMIN, name="alice")
        assert green.status_code == 201, green.text
        assert make(gw, ADMIN_KEY, name="solo", team="green").status_code == 201  # `solo` is of no team
        assert [completions(gw, TEAM_KEY) for _ in range(2)][-1] == 429  # the YAML key, held to its own budget
        # Green's `alice` is not the YAML one: none of its budget, nor blue's `max_priority` (high), its own rows.
        assert [completions(gw, green.json()["secret"]) for _ in range(2)] == [200, 200]
        assert day_view(gw, GREEN_ADMIN) == {"alice": 2, "solo": 0}
        seen = day_view(gw, ADMIN_KEY)  # the YAML `alice`'s refused requests are its own, not green's
        assert (seen["green/alice"], seen["green/solo"], seen["alice"]) == (2, 0, day_view(gw, BLUE_ADMIN)["alice"])
        with client(gw.url, green.json()["secret"]) as c:
            high = c.post("/v1/completions", json=body(), headers={"x-gateway-priority": "high"})
        assert high.status_code == 403 and high.json()["error"]["code"] == "priority_not_allowed", high.text


def test_no_yaml_key_goes_by_a_teams_label(tmp_path: Path) -> None:
    """A YAML key named `green/ci` would be taken for green's runtime key `ci` wherever keys go by their label
    (the fair queue, priorities, the operator's usage views): green's admin would make `ci` and ask for that
    YAML key's `high` priority. Such a config does not load."""
    path = gateway_config(tmp_path, f"sqlite:///{tmp_path / 'ledger.db'}", yaml_alice="team: blue, max_priority: high")
    path.write_text(path.read_text().replace("name: alice", "name: green/ci"))
    with pytest.raises(ConfigError) as info:
        load_config(path, TEAM_ENV)
    assert "keys[0].name: 'green/ci': a key name may not contain '/'" in str(info.value)


def at_version_9(url: str, secret: str) -> None:
    """A ledger as a gateway left it before names were per team: blue's key `ci`, made by its admin."""
    db = Database(url)

    def run(cur: Cursor) -> None:
        cur.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
        for version, statements in enumerate(MIGRATIONS[: PER_TEAM_SINCE - 1], start=1):
            for statement in statements:
                cur.execute(statement if isinstance(statement, str) else statement[db.engine])
            cur.execute("INSERT INTO schema_version (version) VALUES (?)", (version,))
        cur.execute(
            "INSERT INTO api_keys (id, name, team, models, digest, created_at, limits, weight, priority) "
            "VALUES ('key_old', 'ci', 'blue', '[\"**\"]', ?, 0, '{\"rpm\": 50}', 2, 'low')",
            (hashlib.sha256(secret.encode()).hexdigest(),),
        )
        cur.execute("UPDATE counters SET value = 1 WHERE name = 'keys'")

    try:
        db.transaction(run)
    finally:
        db.close()


def upgraded(tmp_path: Path, url: str) -> None:
    secret = "gwk-made-before-per-team-names"
    at_version_9(url, secret)
    with GatewayThread(gateway_config(tmp_path, url), TEAM_ENV) as gw:
        assert completions(gw, secret) == 200
        [old] = call(gw, BLUE_ADMIN, "GET", "/admin/keys").json()["keys"]
        assert (old["id"], old["name"], old["limits"]["rpm"], old["weight"], old["priority"]) == (
            "key_old",
            "ci",
            50,
            2,
            "low",
        )
        assert make(gw, BLUE_ADMIN, name="ci").status_code == 409  # still blue's
        made: Any = make(gw, GREEN_ADMIN, name="ci")
        assert made.status_code == 201, made.text
        assert completions(gw, made.json()["secret"]) == 200
    assert query(url, "SELECT max(version) FROM schema_version")[0][0] == len(MIGRATIONS)


def test_a_ledger_made_before_per_team_names_upgrades_sqlite(tmp_path: Path) -> None:
    upgraded(tmp_path, f"sqlite:///{tmp_path / 'ledger.db'}")


def test_a_ledger_made_before_per_team_names_upgrades_postgres(tmp_path: Path, pg: PostgresServer) -> None:
    upgraded(tmp_path, pg.url)
