"""`POST /admin/keys` refuses what the config refuses for a `keys:` entry (gateway/config/consistency.py's
`key_problem`, against the `teams:` in force): each a 400 naming the field, with the config's own reason. A
reload that removes a team runtime keys name has them refused (403 `team_undeclared`) until it is declared again,
and says so once."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from gateway.config import ConfigError, parse_config
from tests.helpers.clients import client
from tests.helpers.servers import GatewayThread
from tests.helpers.waiting import wait_until

from .conftest import ADMIN_KEY, ENV, config, query
from .test_keys import admin, status

TEAMS = 'teams: {blue: {}, green: {}, red: {}, "-red": {}}'  # the suite's config's
# `boss` lets its keys ask for `high`; `capped`'s may ask for `low` at most.
WITH_BOSS = "teams: {blue: {}, green: {}, red: {}, boss: {max_priority: high}, capped: {max_priority: low}}"

REFUSED: list[tuple[dict[str, Any], str]] = [
    ({"team": "purple"}, "team"),
    ({"max_cost_per_day": 50, "max_cost_per_month": 20.5}, "max_cost_per_day"),
    ({"priority": "high"}, "priority"),  # the highest it may ask for is `normal` when nothing says otherwise
    ({"priority": "normal", "team": "capped"}, "priority"),  # its team's max_priority is `low`
    ({"priority": "high", "max_priority": "normal"}, "priority"),
    # A pattern no model the config routes could match: a misspelt provider, a model without its provider.
    ({"models": ["demo/*", "dmeo/*"]}, "models[1]"),
    ({"models": ["long"]}, "models[0]"),
]
# The suite config's providers and aliases, which a key's `models` are held to.
ROUTES = "providers: {demo: {kind: fake, models: [long, text]}}\nmodels: [{name: fast, targets: [{model: demo/long}]}]"


def _yaml_problem(spec: dict[str, Any]) -> str:
    """What the config says of a `keys:` entry with these fields."""
    fields = ", ".join(f"{k}: {v}" for k, v in spec.items())
    text = WITH_BOSS + "\n" + ROUTES + f"\nkeys: [{{name: k1, key: s1, {fields}}}]\n"
    with pytest.raises(ConfigError) as info:
        parse_config(text, "gw.yaml", {})
    return str(info.value).split(": ", 2)[2]  # past `gw.yaml: keys[0].<field>: `


@pytest.fixture
def gateway(tmp_path: Path) -> Any:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    path = tmp_path / "config.yaml"
    text = config(url)
    assert TEAMS in text
    path.write_text(text.replace(TEAMS, WITH_BOSS))
    with GatewayThread(path, ENV) as gw:
        yield gw, url


@pytest.mark.parametrize(("spec", "param"), REFUSED)
def test_a_runtime_key_is_refused_what_a_yaml_key_is(gateway: Any, spec: dict[str, Any], param: str) -> None:
    gw, url = gateway
    resp = admin(gw.url, "POST", "/admin/keys", {"name": "ci", **spec})
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error", error
    assert error["code"] == "invalid_value"
    assert _yaml_problem(spec) in error["message"]  # the config's own reason, from the same check
    assert query(url, "SELECT count(*) FROM api_keys") == [(0,)]


def test_no_key_goes_by_a_teams_share_of_the_queue(gateway: Any) -> None:
    """Under `queue.fair_by: team` blue's keys wait as one tenant, `team:blue`: a key of no team named so would
    wait as blue, taking blue's weight and sharing its turn. Neither a runtime key nor a YAML key may be named so."""
    gw, url = gateway
    resp = admin(gw.url, "POST", "/admin/keys", {"name": "team:blue"})
    assert resp.status_code == 400, resp.text
    assert (resp.json()["error"]["param"], resp.json()["error"]["code"]) == ("name", "invalid_value")
    assert "may not begin with 'team:'" in resp.json()["error"]["message"]
    assert admin(gw.url, "POST", "/admin/keys", {"name": "teams:blue"}).status_code == 201  # only the prefix
    with pytest.raises(ConfigError, match=r"keys\[0\]\.name: a key name may not begin with 'team:'"):
        parse_config(ROUTES + "\nkeys: [{name: 'team:blue', key: s1}]\n", "gw.yaml", {})


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ('{"name": "ci", "weight": 1e400}', "weight"),  # JSON's overflowing literal reads as infinity
        ('{"name": "ci", "max_cost_per_month": 1e400}', "max_cost_per_month"),
        ('{"name": "ci", "limits": {"rpm": 0}}', "limits.rpm"),
        ('{"name": "ci", "limits": {"tpd": 10000000000000}}', "limits.tpd"),
        ('{"name": "ci", "models": [""]}', "models"),
        ('{"name": ""}', "name"),
    ],
)
def test_values_out_of_their_own_range_name_the_field(gateway: Any, body: str, param: str) -> None:
    gw, _ = gateway
    with client(gw.url, ADMIN_KEY) as c:
        resp = c.post("/admin/keys", content=body, headers={"content-type": "application/json"})
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == param, resp.text


def test_what_the_config_allows_a_runtime_key_is_allowed(gateway: Any) -> None:
    gw, _ = gateway
    for spec in (
        {"name": "a", "team": "boss", "priority": "high"},  # its team lets it ask for `high`
        {"name": "b", "team": "capped", "priority": "low"},
        {"name": "c", "max_cost_per_day": 20.5, "max_cost_per_month": 20.5},  # equal: both reachable
        {"name": "d", "team": "red", "priority": "low", "max_priority": "high"},
        # An alias, a provider's model it does not list (it still routes), a glob whose provider is a glob.
        {"name": "e", "models": ["fast", "demo/unlisted", "d*/long", "*"]},
    ):
        resp = admin(gw.url, "POST", "/admin/keys", spec)
        assert resp.status_code == 201, resp.text
        assert status(gw.url, resp.json()["secret"]) == 200


def test_a_reload_that_removes_a_keys_team_refuses_the_key_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in ENV.items():  # a reload reads the process's environment
        monkeypatch.setenv(name, value)
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    path = tmp_path / "config.yaml"
    path.write_text(config(url))
    caplog.set_level(logging.INFO, logger="gateway")
    with GatewayThread(path, ENV) as gw:
        made = admin(gw.url, "POST", "/admin/keys", {"name": "ci", "team": "red"})
        assert made.status_code == 201, made.text
        secret = made.json()["secret"]
        assert status(gw.url, secret) == 200
        path.write_text(config(url).replace(TEAMS, 'teams: {blue: {}, green: {}, "-red": {}}'))
        wait_until(lambda: "red" not in gw.pipeline.loaded.config.teams, timeout=10)
        said = (
            "ledger: runtime key(s) 'ci' (team 'red') name a team not under teams:; they are refused "
            "(403 team_undeclared) until it is declared again"
        )
        wait_until(lambda: any(r.getMessage().startswith(said) for r in caplog.records), timeout=5)
        assert status(gw.url, secret) == 403  # refused, not let through without its team's budgets and limits
        # A new key may not name it any more.
        resp = admin(gw.url, "POST", "/admin/keys", {"name": "next", "team": "red"})
        assert resp.status_code == 400 and resp.json()["error"]["param"] == "team", resp.text
        listed = admin(gw.url, "GET", "/admin/keys").json()["keys"]
        assert [(k["name"], k["team"]) for k in listed] == [("ci", "red")]
    warned = [r for r in caplog.records if r.getMessage().startswith(said)]
    assert len(warned) == 1 and warned[0].levelno == logging.WARNING
    assert query(url, "SELECT DISTINCT team FROM requests WHERE key_name = 'ci'") == [("red",)]


def test_a_reload_that_removes_what_a_keys_pattern_names_keeps_the_key_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in ENV.items():  # a reload reads the process's environment
        monkeypatch.setenv(name, value)
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    path = tmp_path / "config.yaml"
    path.write_text(config(url))
    caplog.set_level(logging.INFO, logger="gateway")
    with GatewayThread(path, ENV) as gw:
        made = admin(gw.url, "POST", "/admin/keys", {"name": "ci", "models": ["demo/long", "fast"]})
        assert made.status_code == 201, made.text
        secret = made.json()["secret"]
        assert status(gw.url, secret) == 200
        path.write_text(config(url).replace("name: fast,", "name: quick,"))  # the alias `fast` is renamed
        wait_until(lambda: "quick" in gw.pipeline.router.aliases, timeout=10)
        said = (
            "ledger: runtime key(s) with a models pattern the config routes nothing to: 'ci' models[1]: 'fast' is "
            "neither an alias nor <provider>/<model>"
        )
        wait_until(lambda: any(r.getMessage() == said for r in caplog.records), timeout=5)
        assert status(gw.url, secret) == 200  # its other pattern still allows demo/long
        resp = admin(gw.url, "POST", "/admin/keys", {"name": "next", "models": ["fast"]})
        assert resp.status_code == 400 and resp.json()["error"]["param"] == "models[0]", resp.text
    warned = [r for r in caplog.records if r.getMessage() == said]
    assert len(warned) == 1 and warned[0].levelno == logging.WARNING
