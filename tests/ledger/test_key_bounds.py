"""Keys and secrets an admin key cannot make without end: a team's keys (`teams.<name>.max_keys`) and a key's
earlier secrets still in their grace (`MAX_GRACE_SECRETS`).

Every replica holds each key in force in memory and reloads all of them at every change, and each key has
batch quotas of its own (`batches.max_key_bytes`, `max_files`, `max_batches`): a team admin minting keys
without bound would take unbounded memory and storage of a gateway shared with other teams. Over real
sockets, on a real SQLite file and on PostgreSQL with creations racing: past the team's count the answer is
409 `too_many_keys`; a revoked key frees its place; the operator's admin key is held to no count (its keys
of the team count toward the team's). Each earlier secret in its grace is one more key in force on every
replica too: past 16, a rotation with a grace is a 409 `too_many_secrets`, one with `grace_s: 0` never is.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Final

import pytest

from gateway.config import ConfigError, TeamConfig, parse_config
from gateway.ledger.keys import MAX_GRACE_SECRETS
from tests.helpers.clients import body, client
from tests.helpers.postgres import PostgresServer
from tests.helpers.servers import GatewayThread

from .conftest import ADMIN_KEY, config, query
from .test_team_admins import BLUE_ADMIN, GREEN_ADMIN, TEAM_ENV, TEAMS, call, make

CAPPED: Final = (
    "teams: {blue: {admin_key: '${BLUE_ADMIN}', max_keys: 3}, green: {admin_key: '${GREEN_ADMIN}', max_keys: 3},"
    " red: {}, '-red': {}}"
)


def _gateway(tmp_path: Path, url: str) -> GatewayThread:
    path = tmp_path / "config.yaml"
    path.write_text(config(url, extra=f', spill_dir: "{tmp_path / "spill"}"').replace(TEAMS, CAPPED))
    return GatewayThread(path, TEAM_ENV)


def _too_many(resp: Any, why: str) -> None:
    assert resp.status_code == 409, resp.text
    error = resp.json()["error"]
    assert error["code"] == "too_many_keys" and error["type"] == "invalid_request_error", error
    assert "(teams.blue.max_keys) 3" in error["message"] or "(teams.green.max_keys) 3" in error["message"], error
    assert why in error["message"], error


def test_a_team_admin_holds_and_makes_at_most_max_keys(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    with _gateway(tmp_path, url) as gw:
        made = [make(gw, BLUE_ADMIN, name=f"b{i}") for i in range(3)]
        assert [m.status_code for m in made] == [201, 201, 201], [m.text for m in made]
        _too_many(make(gw, BLUE_ADMIN, name="b3"), "holds 3 keys")
        # Made a day ago: only the count of keys in force binds.
        query(url, "UPDATE api_keys SET created_at = created_at - 2 * 86400")
        # The operator is not held to it; its key of the team counts toward the team's all the same.
        assert make(gw, ADMIN_KEY, name="ops", team="blue").status_code == 201
        first, second = (m.json()["key"]["id"] for m in made[:2])
        assert call(gw, BLUE_ADMIN, "DELETE", f"/admin/keys/{first}").status_code == 200
        _too_many(make(gw, BLUE_ADMIN, name="b3"), "holds 3 keys")  # b1, b2 and the operator's
        assert call(gw, BLUE_ADMIN, "DELETE", f"/admin/keys/{second}").status_code == 200
        assert make(gw, BLUE_ADMIN, name="b3").status_code == 201  # a revoked key frees its place
        held = "SELECT count(*) FROM api_keys WHERE team = 'blue' AND revoked_at IS NULL"
        assert query(url, held) == [(3,)]
        # Making and revoking in turn: a revoked key stays in the ledger, so the day's keys are counted too.
        for i in range(3):
            key = make(gw, GREEN_ADMIN, name=f"g{i}")
            assert key.status_code == 201, key.text
            assert call(gw, GREEN_ADMIN, "DELETE", f"/admin/keys/{key.json()['key']['id']}").status_code == 200
        _too_many(make(gw, GREEN_ADMIN, name="g3"), "made 3 keys in the last 24 hours")
        assert query(url, "SELECT count(*) FROM api_keys WHERE team = 'green'") == [(3,)]


def test_racing_creations_on_postgres_stop_at_max_keys(tmp_path: Path, pg: PostgresServer) -> None:
    # Two replicas on one database, each asked at once: the count holds across them.
    with _gateway(tmp_path, pg.url) as one, _gateway(tmp_path, pg.url) as two, ThreadPoolExecutor(12) as pool:
        replicas = (one, two)
        answers = list(pool.map(lambda i: make(replicas[i % 2], BLUE_ADMIN, name=f"r{i}").status_code, range(12)))
        assert sorted(answers) == [201] * 3 + [409] * 9, answers
        assert query(pg.url, "SELECT count(*) FROM api_keys WHERE team = 'blue' AND revoked_at IS NULL") == [(3,)]


def test_the_default_is_documented() -> None:
    assert TeamConfig().max_keys == 1_000
    documented = (Path(__file__).parents[2] / "docs/config.md").read_text()
    assert "`teams.<key>.max_keys` | int 0–1000000 | `1000`" in documented


def test_rotations_in_a_row_keep_at_most_sixteen_secrets_in_grace(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    with _gateway(tmp_path, url) as gw:
        made = make(gw, BLUE_ADMIN, name="ci").json()
        key_id, first = made["key"]["id"], made["secret"]
        rotate = f"/admin/keys/{key_id}/rotate"
        for _ in range(MAX_GRACE_SECRETS):
            assert call(gw, BLUE_ADMIN, "POST", rotate, json={"grace_s": 86_400}).status_code == 200
        for admin, grace in ((BLUE_ADMIN, {"grace_s": 86_400}), (ADMIN_KEY, {"grace_s": 1}), (BLUE_ADMIN, None)):
            resp = call(gw, admin, "POST", rotate, json=grace)  # None: no body, the default grace
            assert resp.status_code == 409, resp.text
            error = resp.json()["error"]
            assert error["code"] == "too_many_secrets" and error["param"] == "grace_s", error
            assert error["type"] == "invalid_request_error", error
        assert query(url, "SELECT count(*) FROM key_secrets") == [(MAX_GRACE_SECRETS,)]
        # A leaked secret can always be replaced at once; the earlier ones keep their grace.
        now = call(gw, BLUE_ADMIN, "POST", rotate, json={"grace_s": 0})
        assert now.status_code == 200, now.text
        assert query(url, "SELECT count(*) FROM key_secrets") == [(MAX_GRACE_SECRETS,)]
        for secret in (first, now.json()["secret"]):
            with client(gw.url, secret) as c:
                assert c.post("/v1/completions", json=body()).status_code == 200


def test_a_weight_too_small_to_divide_by_is_refused(tmp_path: Path) -> None:
    """The fair queue charges tokens / weight: 5e-324 charges infinity, which lifts every tenant waiting after
    it to an infinite service (the weighted order ends for all). At least 0.001, from either admin, in YAML."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    with _gateway(tmp_path, url) as gw:
        for admin, weight in ((BLUE_ADMIN, 5e-324), (BLUE_ADMIN, 0.0009), (ADMIN_KEY, 1e-300)):
            resp = make(gw, admin, name="tiny", weight=weight)
            assert resp.status_code == 400 and resp.json()["error"]["param"] == "weight", (weight, resp.text)
        assert make(gw, BLUE_ADMIN, name="small", weight=0.001).status_code == 201
    for where in ("keys: [{name: k, key: s, weight: 5.0e-324}]", "teams: {t: {weight: 0.0001}}"):
        with pytest.raises(ConfigError) as info:
            parse_config(where + "\n", "gw.yaml", {})
        assert "weight" in str(info.value) and ">= 0.001" in str(info.value), str(info.value)
