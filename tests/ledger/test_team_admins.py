"""A team's admin key (`teams.<name>.admin_key`): its team's runtime keys, usage and batches, nothing else.

Over real sockets, on a real SQLite ledger file: `blue`'s admin makes keys of its team only and no more than
the team may (budgets, share, priority, rates), lists, rotates and revokes its team's keys only (another
team's key id is a 404 like an unknown one), reads its team's rows, status and its team's keys' batches only,
and is refused (403 `operator_only`) on every other admin route, which are read from the source so a new one
is classified here before it ships. The operator's key keeps every power.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import pytest

from gateway.config import ConfigError, parse_config
from gateway.edge.admin_role import OPERATOR, AdminRole, admin_keys
from gateway.limits.usage import day_of
from tests.helpers.clients import body, client
from tests.helpers.postgres import PostgresServer
from tests.helpers.servers import GatewayThread, rewrite
from tests.helpers.waiting import wait_until

from .conftest import ADMIN_KEY, ENV, SOLO_KEY, TEAM_KEY, config, query

ROOT: Final = Path(__file__).resolve().parents[2]
BLUE_ADMIN: Final = "adm-team-blue-5c1e"
GREEN_ADMIN: Final = "adm-team-green-77a0"
TEAMS: Final = 'teams: {blue: {}, green: {}, red: {}, "-red": {}}'
WITH_ADMINS: Final = (
    "teams: {blue: {admin_key: '${BLUE_ADMIN}', max_cost_per_day: 10, max_cost_per_month: 100, weight: 2,"
    " max_priority: high, limits: {rpm: 1000, tpm: 400000}}, green: {admin_key: '${GREEN_ADMIN}'}, red: {},"
    " '-red': {}}"
)
TEAM_ENV: Final = {**ENV, "BLUE_ADMIN": BLUE_ADMIN, "GREEN_ADMIN": GREEN_ADMIN}

# Every admin route, as the source declares it: the ones a team admin uses (narrowed to its team), and the
# operator's alone, each with a request that reaches it.
TEAM_ROUTES: Final = {
    "/admin/keys",
    "/admin/keys/{key_id:str}",
    "/admin/keys/{key_id:str}/rotate",
    "/admin/usage",
    "/admin/status",
    "/admin/batches",
    "/admin/batches/{batch_id:str}",
    "/admin/batches/{batch_id:str}/cancel",
}
OPERATOR_ROUTES: Final = {
    "/admin/cache": ("DELETE", "/admin/cache"),
    "/admin/providers/{name:str}/replicas/{index:int}/drain": ("POST", "/admin/providers/demo/replicas/0/drain"),
    "/admin/providers/{name:str}/replicas/{index:int}/undrain": ("POST", "/admin/providers/demo/replicas/0/undrain"),
}


def admin_routes() -> set[str]:
    found: set[str] = set()
    for module in (ROOT / "gateway" / "edge").glob("*.py"):
        found |= set(re.findall(r"@(?:get|post|delete|put|patch)\(\s*\"(/admin[^\"]*)\"", module.read_text()))
    return found


def call(gw: GatewayThread, key: str | None, method: str, path: str, **kwargs: Any) -> Any:
    with client(gw.url, key) as c:
        return c.request(method, path, **kwargs)


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[tuple[GatewayThread, str]]:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    text = config(url)
    assert TEAMS in text
    path = tmp_path / "config.yaml"
    path.write_text(text.replace(TEAMS, WITH_ADMINS))
    with GatewayThread(path, TEAM_ENV) as gw:
        yield gw, url


def make(gw: GatewayThread, key: str, **spec: Any) -> Any:
    return call(gw, key, "POST", "/admin/keys", json=spec)


def test_a_team_admin_makes_keys_of_its_own_team_within_its_means(gateway: tuple[GatewayThread, str]) -> None:
    gw, url = gateway
    made = make(gw, BLUE_ADMIN, name="b1")
    assert made.status_code == 201, made.text
    assert made.json()["key"]["team"] == "blue"  # its team, unasked
    secret = made.json()["secret"]
    with client(gw.url, secret) as c:
        assert c.post("/v1/completions", json=body()).status_code == 200
    ok = make(gw, BLUE_ADMIN, name="b2", team="blue", max_cost_per_day=10, max_cost_per_month=100, weight=2)
    assert ok.status_code == 201, ok.text
    assert make(gw, BLUE_ADMIN, name="b3", max_priority="high").status_code == 201  # blue's own ceiling
    refused: list[tuple[str, dict[str, Any], str]] = [
        (BLUE_ADMIN, {"team": "green"}, "team"),
        (BLUE_ADMIN, {"team": "red"}, "team"),
        (BLUE_ADMIN, {"team": "purple"}, "team"),  # undeclared: still not its own
        (BLUE_ADMIN, {"max_cost_per_day": 10.01}, "max_cost_per_day"),
        (BLUE_ADMIN, {"max_cost_per_month": 100.5}, "max_cost_per_month"),
        (BLUE_ADMIN, {"weight": 2.5}, "weight"),
        (GREEN_ADMIN, {"max_priority": "high"}, "max_priority"),  # green's ceiling is `normal`
        (GREEN_ADMIN, {"team": "blue"}, "team"),
        (BLUE_ADMIN, {"limits": {"rpm": 1001}}, "limits.rpm"),
        (BLUE_ADMIN, {"limits": {"rpm": 5, "tpm": 400001}}, "limits.tpm"),
    ]
    for key, spec, param in refused:
        resp = make(gw, key, name="x", **spec)
        assert resp.status_code == 403, (spec, resp.text)
        error = resp.json()["error"]
        assert error["param"] == param and error["code"] == "beyond_team", (spec, error)
        assert error["type"] == "permission_error"
    limits = make(gw, BLUE_ADMIN, name="x", limits={"tpm": 500000}).json()["error"]["message"]
    assert limits == "Not allowed 'limits.tpm': 500000 is above team 'blue''s limits.tpm 400000"
    assert query(url, "SELECT name FROM api_keys ORDER BY name") == [("b1",), ("b2",), ("b3",)]
    # Up to the team's rates, and any rate the team leaves unset.
    within = make(gw, BLUE_ADMIN, name="b4", limits={"rpm": 1000, "tpm": 400000, "rps": 50, "concurrent": 9})
    assert within.status_code == 201, within.text
    # The operator is held to the config's rules only: any team, any budget, any rate.
    assert make(gw, ADMIN_KEY, name="g1", team="green", max_cost_per_day=500, weight=50).status_code == 201
    assert make(gw, ADMIN_KEY, name="b5", team="blue", limits={"rpm": 50000}).status_code == 201


def test_a_team_admin_lists_rotates_and_revokes_its_teams_keys_only(gateway: tuple[GatewayThread, str]) -> None:
    narrowed(*gateway)


def test_the_same_on_postgres(tmp_path: Path, pg: PostgresServer) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(config(pg.url, extra=f', spill_dir: "{tmp_path / "spill"}"').replace(TEAMS, WITH_ADMINS))
    with GatewayThread(path, TEAM_ENV) as gw:
        narrowed(gw, pg.url)


def narrowed(gw: GatewayThread, url: str) -> None:
    """Listing, rotation and revocation by a team admin reach its team's keys and nothing else."""
    blue = make(gw, BLUE_ADMIN, name="b1").json()["key"]["id"]
    green = make(gw, ADMIN_KEY, name="g1", team="green").json()
    green_id, green_secret = green["key"]["id"], green["secret"]
    none_id = make(gw, ADMIN_KEY, name="n1").json()["key"]["id"]
    listed = call(gw, BLUE_ADMIN, "GET", "/admin/keys").json()["keys"]
    assert [k["id"] for k in listed] == [blue]
    assert [k["id"] for k in call(gw, GREEN_ADMIN, "GET", "/admin/keys").json()["keys"]] == [green_id]
    assert {k["id"] for k in call(gw, ADMIN_KEY, "GET", "/admin/keys").json()["keys"]} == {blue, green_id, none_id}

    unknown = "key_0123456789abcdef"
    # A NUL, which no id holds and PostgreSQL's text refuses: the same 404, not an error of the database's.
    for other in (green_id, none_id, unknown, "key_%00"):
        for method, path in (("POST", f"/admin/keys/{other}/rotate"), ("DELETE", f"/admin/keys/{other}")):
            resp = call(gw, BLUE_ADMIN, method, path)
            assert resp.status_code == 404, (method, path, resp.text)
            # The same answer as for an id that does not exist: nothing tells another team's id apart.
            assert resp.json()["error"]["message"] == f"No key {other.replace('%00', chr(0))!r}"
            assert resp.json()["error"]["code"] == "not_found"
    with client(gw.url, green_secret) as c:  # untouched: neither rotated nor revoked
        assert c.post("/v1/completions", json=body()).status_code == 200
    assert query(url, "SELECT count(*) FROM api_keys WHERE revoked_at IS NOT NULL") == [(0,)]

    assert call(gw, BLUE_ADMIN, "POST", f"/admin/keys/{blue}/rotate", json={"grace_s": 0}).status_code == 200
    assert call(gw, BLUE_ADMIN, "DELETE", f"/admin/keys/{blue}").status_code == 200
    assert call(gw, ADMIN_KEY, "DELETE", f"/admin/keys/{green_id}").status_code == 200  # the operator: any key


def test_a_team_admin_reads_its_teams_usage_only(gateway: tuple[GatewayThread, str]) -> None:
    gw, _ = gateway
    green = make(gw, ADMIN_KEY, name="g1", team="green").json()["secret"]
    blue = make(gw, BLUE_ADMIN, name="b1").json()["secret"]
    for key in (TEAM_KEY, SOLO_KEY, green, blue):  # alice (blue, from the YAML), solo (no team), g1, b1
        with client(gw.url, key) as c:
            assert c.post("/v1/completions", json=body()).status_code == 200
    today = day_of(time.time())
    by_key = call(gw, BLUE_ADMIN, "GET", "/admin/usage", params={"from": today, "by": "key"}).json()
    assert sorted(r["key"] for r in by_key["rows"]) == ["alice", "b1"]
    assert by_key["totals"]["requests"] == 2
    by_team = call(gw, BLUE_ADMIN, "GET", "/admin/usage", params={"from": today, "by": "team"}).json()
    assert [r["team"] for r in by_team["rows"]] == ["blue"]
    csv = call(gw, BLUE_ADMIN, "GET", "/admin/usage", params={"from": today, "format": "csv"}).text
    assert "alice" in csv and "b1" in csv and "solo" not in csv and "g1" not in csv
    day = call(gw, BLUE_ADMIN, "GET", "/admin/usage", params={"day": today}).json()
    assert sorted(day["keys"]) == ["alice", "b1"]
    # The `team` column is forced: a parameter cannot widen it.
    sneaky = call(gw, BLUE_ADMIN, "GET", "/admin/usage", params={"from": today, "by": "key", "team": "green"})
    assert sorted(r["key"] for r in sneaky.json()["rows"]) == ["alice", "b1"]
    green_day = call(gw, GREEN_ADMIN, "GET", "/admin/usage").json()
    assert sorted(green_day["keys"]) == ["g1"]
    everyone = call(gw, ADMIN_KEY, "GET", "/admin/usage", params={"from": today, "by": "key"}).json()
    # A team's runtime key is `team/name` to the operator (each team names its keys in its own namespace).
    assert sorted(r["key"] for r in everyone["rows"]) == ["alice", "blue/b1", "green/g1", "solo"]
    assert sorted(call(gw, ADMIN_KEY, "GET", "/admin/usage").json()["keys"]) == ["alice", "blue/b1", "green/g1", "solo"]


def batch_of(gw: GatewayThread, key: str) -> str:
    """A batch of one line made by the client key `key`: its id."""
    line = b'{"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {"model": "fast", "prompt": "x"}}\n'
    with client(gw.url, key) as c:
        uploaded = c.post("/v1/files", data={"purpose": "batch"}, files={"file": ("in.jsonl", line)})
        assert uploaded.status_code == 200, uploaded.text
        spec = {"input_file_id": uploaded.json()["id"], "endpoint": "/v1/completions", "completion_window": "24h"}
        made = c.post("/v1/batches", json=spec)
        assert made.status_code == 200, made.text
        return str(made.json()["id"])


def listed(gw: GatewayThread, admin: str, **params: Any) -> list[tuple[str, str]]:
    resp = call(gw, admin, "GET", "/admin/batches", params={"limit": 100, **params})
    assert resp.status_code == 200, resp.text
    return [(b["id"], b["owner"]) for b in resp.json()["data"]]


def test_a_team_admin_sees_its_teams_batches_only(gateway: tuple[GatewayThread, str]) -> None:
    team_batches(*gateway)


def test_team_batches_on_postgres(tmp_path: Path, pg: PostgresServer) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(config(pg.url, extra=f', spill_dir: "{tmp_path / "spill"}"').replace(TEAMS, WITH_ADMINS))
    with GatewayThread(path, TEAM_ENV) as gw:
        team_batches(gw, pg.url)


def team_batches(gw: GatewayThread, url: str) -> None:
    """`GET /admin/batches` for a team's admin: the batches of its team's keys, YAML (whose team only the config
    knows) and runtime (whose team the ledger holds), and nothing of another team's or of a key of none."""
    b1 = make(gw, BLUE_ADMIN, name="b1").json()
    g1 = make(gw, ADMIN_KEY, name="g1", team="green").json()["secret"]
    n1 = make(gw, ADMIN_KEY, name="n1").json()["secret"]
    # Made in turns, oldest first, so that each other key's batch lies before or between the team's.
    green = {batch_of(gw, g1): "g1"}
    solo = batch_of(gw, SOLO_KEY)
    alice = batch_of(gw, TEAM_KEY)  # blue, from the YAML
    none = {solo: "solo", batch_of(gw, n1): "n1"}  # keys of no team: YAML and runtime
    mine = {alice: "alice", batch_of(gw, b1["secret"]): "b1"}

    # The operator: every key's, a team's runtime key as `team/name`; a team's admin: its own, by name.
    labels = {"b1": "blue/b1", "g1": "green/g1"}
    assert dict(listed(gw, ADMIN_KEY)) == {b: labels.get(n, n) for b, n in {**mine, **green, **none}.items()}
    assert dict(listed(gw, BLUE_ADMIN)) == mine
    assert dict(listed(gw, GREEN_ADMIN)) == green

    # Paging stays within the team: another team's id (or a no-team key's) is a cursor that does not exist, as
    # an unknown one, so the page it gives is the first one and tells nothing of when that batch was made.
    first = listed(gw, BLUE_ADMIN, limit=1)
    assert len(first) == 1 and first[0][0] in mine
    for foreign in [*green, *none, "batch_0123456789abcdef"]:
        assert listed(gw, BLUE_ADMIN, limit=1, after=foreign) == first, foreign
    rest = listed(gw, BLUE_ADMIN, after=first[0][0])
    assert len(rest) == 1 and {first[0][0], rest[0][0]} == set(mine)

    # A team admin's key is no client key on the Batch API's own routes (its own are /admin/batches/<id>...).
    some = next(iter(green))
    for method, path in (("GET", f"/v1/batches/{some}"), ("POST", f"/v1/batches/{some}/cancel")):
        assert call(gw, BLUE_ADMIN, method, path).status_code == 401

    # A revoked key's batches stay its team's: what it made is still the team's to see.
    assert call(gw, BLUE_ADMIN, "DELETE", f"/admin/keys/{b1['key']['id']}").status_code == 200
    assert {b for b, _ in listed(gw, BLUE_ADMIN)} == set(mine)
    assert query(url, "SELECT count(*) FROM batches") == [(5,)]


def test_every_other_admin_route_is_the_operators(gateway: tuple[GatewayThread, str]) -> None:
    gw, _ = gateway
    # A route added to the edge wing is classified here, or this fails: a team admin's reach never grows unseen.
    assert admin_routes() == TEAM_ROUTES | set(OPERATOR_ROUTES)
    for method, path in OPERATOR_ROUTES.values():
        resp = call(gw, BLUE_ADMIN, method, path)
        assert resp.status_code == 403, (method, path, resp.text)
        assert resp.json()["error"]["code"] == "operator_only", resp.text
        assert call(gw, None, method, path).status_code == 401
        assert call(gw, "not-a-key", method, path).status_code == 401
        operator = call(gw, ADMIN_KEY, method, path)
        assert operator.status_code not in (401, 403), (method, path, operator.text)


def test_admin_keys_and_client_keys_are_not_each_other(gateway: tuple[GatewayThread, str]) -> None:
    gw, _ = gateway
    with client(gw.url, BLUE_ADMIN) as c:
        assert c.post("/v1/completions", json=body()).status_code == 401
    for key in (TEAM_KEY, make(gw, BLUE_ADMIN, name="b1").json()["secret"]):
        assert call(gw, key, "GET", "/admin/keys").status_code == 401


def test_team_admins_without_an_operator_key(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    text = config(url).replace(TEAMS, WITH_ADMINS).replace('admin: {key: "${LEDGER_ADMIN_KEY}"}\n', "")
    path = tmp_path / "config.yaml"
    path.write_text(text)
    with GatewayThread(path, TEAM_ENV) as gw:
        assert make(gw, BLUE_ADMIN, name="b1").status_code == 201
        assert call(gw, BLUE_ADMIN, "GET", "/admin/status").json()["team"] == "blue"
        assert call(gw, BLUE_ADMIN, "DELETE", "/admin/cache").status_code == 403
        assert call(gw, None, "GET", "/admin/keys").status_code == 401
        assert call(gw, None, "GET", "/").status_code == 200  # the status page, for the team's admin


def test_without_a_ledger_a_team_admin_reads_its_teams_keys_only(tmp_path: Path) -> None:
    text = re.sub(r"ledger: \{[^\n]*\n", "", config("sqlite:///unused.db").replace(TEAMS, WITH_ADMINS))
    assert "ledger" not in text
    path = tmp_path / "config.yaml"
    path.write_text(text)
    with GatewayThread(path, TEAM_ENV) as gw:
        for key in (TEAM_KEY, SOLO_KEY):
            with client(gw.url, key) as c:
                assert c.post("/v1/completions", json=body()).status_code == 200
        assert sorted(call(gw, BLUE_ADMIN, "GET", "/admin/usage").json()["keys"]) == ["alice"]
        assert sorted(call(gw, GREEN_ADMIN, "GET", "/admin/usage").json()["keys"]) == []
        assert sorted(call(gw, ADMIN_KEY, "GET", "/admin/usage").json()["keys"]) == ["alice", "solo"]
        # The status's usage too, by key name; no ledger, so no spend per day and no batches.
        view = call(gw, BLUE_ADMIN, "GET", "/admin/status").json()
        assert sorted(view["usage"]["keys"]) == ["alice"] and view["ledger"] == "disabled"
        assert view["spend_per_day"] is None and "batches" not in view
        assert sorted(call(gw, GREEN_ADMIN, "GET", "/admin/status").json()["usage"]["keys"]) == []
        assert call(gw, BLUE_ADMIN, "GET", "/admin/keys").status_code == 404  # runtime keys need a ledger


def test_a_reload_that_removes_a_teams_admin_key_ends_its_access(tmp_path: Path) -> None:
    # Literal secrets: a reload reads the process environment, which the suite does not set.
    text = config(f"sqlite:///{tmp_path / 'ledger.db'}").replace(TEAMS, WITH_ADMINS)
    for var, secret in (("BLUE_ADMIN", BLUE_ADMIN), ("GREEN_ADMIN", GREEN_ADMIN), ("LEDGER_ADMIN_KEY", ADMIN_KEY)):
        text = text.replace("${" + var + "}", secret)
    path = tmp_path / "config.yaml"
    path.write_text(text)
    with GatewayThread(path, TEAM_ENV, poll_every=0.1) as gw:
        assert call(gw, BLUE_ADMIN, "GET", "/admin/keys").status_code == 200
        before = gw.app.state.reloader.reloads
        rewrite(path, text.replace(f"admin_key: '{BLUE_ADMIN}', ", ""))
        wait_until(lambda: gw.app.state.reloader.reloads > before, timeout=10)
        assert call(gw, BLUE_ADMIN, "GET", "/admin/keys").status_code == 401
        assert call(gw, GREEN_ADMIN, "GET", "/admin/keys").status_code == 200
        assert call(gw, ADMIN_KEY, "GET", "/admin/keys").status_code == 200


@pytest.mark.parametrize(
    ("teams", "problem"),
    [
        ("{blue: {admin_key: s1}}", "teams.blue.admin_key: the same secret as key 'k1'"),
        ("{blue: {admin_key: adm}}", "teams.blue.admin_key: the same secret as admin.key"),
        ("{blue: {admin_key: t}, green: {admin_key: t}}", "teams.green.admin_key: the same secret as team 'blue'"),
        ('{blue: {admin_key: "t\\n"}}', "teams.blue.admin_key: contains a line break"),
        ("{blue: {}}\nkeys: [{name: k2, key: adm}]", "keys[0].key: the same secret as admin.key"),
    ],
)
def test_a_team_admin_key_is_a_secret_of_its_own(teams: str, problem: str) -> None:
    text = f"admin: {{key: adm}}\nteams: {teams}\n"
    text += "" if "keys:" in teams else "keys: [{name: k1, key: s1}]\n"
    with pytest.raises(ConfigError) as info:
        parse_config(text, "gw.yaml", {})
    assert f"gw.yaml: {problem}" in str(info.value)


def test_an_unset_variable_leaves_the_team_without_an_admin() -> None:
    text = "admin: {key: adm}\nteams: {blue: {admin_key: '${NOT_SET_ANYWHERE}'}, green: {admin_key: g}}\n"
    loaded = parse_config(text, "gw.yaml", {})
    assert loaded.missing_for("teams.blue.admin_key") == ["NOT_SET_ANYWHERE"]
    assert [role for _, role in admin_keys(loaded)] == [OPERATOR, AdminRole("green")]
