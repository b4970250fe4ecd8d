"""Keys are identities, not names, and a row keeps what was true when it was answered.

Real gateways (uvicorn in threads, or the CLI as a child) on a real SQLite file. The writer's interval is
a minute in most tests here, so every row waits in the queue across the change being tested (a key
revoked, a team moved, a reload) and is written only when the gateway stops.
"""

from __future__ import annotations

import hashlib
import logging
import time
from pathlib import Path
from typing import Any

import pytest

from gateway.ledger.engine import Cursor, Database
from gateway.ledger.schema import MIGRATIONS
from tests.helpers.clients import body, client
from tests.helpers.postgres import PostgresServer
from tests.helpers.servers import GatewayProcess, GatewayThread, cli_env
from tests.helpers.waiting import wait_until

from .conftest import ADMIN_KEY, ENV, SOLO_KEY, TEAM_KEY, config, query


def admin(url: str, method: str, path: str, json: Any = None, **params: str) -> Any:
    with client(url, ADMIN_KEY) as c:
        return c.request(method, path, json=json, params=params)


def status(url: str, key: str | None) -> int:
    with client(url, key) as c:
        return c.post("/v1/completions", json=body()).status_code


def reload_to(gw: GatewayThread, path: Path, text: str, done: Any) -> None:
    """Rewrite the config file and wait for the gateway's file watch to swap it in."""
    path.write_text(text)
    wait_until(lambda: done(gw.pipeline.loaded.config), timeout=10)


def test_a_row_keeps_its_keys_team_and_identity_of_the_moment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in ENV.items():  # a reload reads the process's environment
        monkeypatch.setenv(name, value)
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    path = tmp_path / "config.yaml"
    path.write_text(config(url, flush_ms=60_000))
    with GatewayThread(path, ENV) as gw:
        made = admin(gw.url, "POST", "/admin/keys", {"name": "ci", "team": "red"}).json()
        assert status(gw.url, made["secret"]) == 200
        assert admin(gw.url, "DELETE", f"/admin/keys/{made['key']['id']}").status_code == 200
        assert status(gw.url, TEAM_KEY) == 200  # alice, team blue
        assert status(gw.url, SOLO_KEY) == 200  # the YAML key solo
        # A reload moves alice to team green, drops the YAML key solo and adds one named "late".
        moved = config(url, flush_ms=60_000).replace("team: blue", "team: green")
        moved = moved.replace('  - {name: solo, key: "${LEDGER_SOLO_KEY}"}', '  - {name: late, key: "gk-late-5d1e"}')
        reload_to(gw, path, moved, lambda cfg: [k.name for k in cfg.keys] == ["alice", "late"])
        assert status(gw.url, TEAM_KEY) == 200
        # A name the reloaded YAML holds is refused; the name it let go of is free for a runtime key.
        late = admin(gw.url, "POST", "/admin/keys", {"name": "late"})
        assert late.status_code == 409 and late.json()["error"]["code"] == "key_exists"
        solo = admin(gw.url, "POST", "/admin/keys", {"name": "solo"})
        assert solo.status_code == 201, solo.text
        assert status(gw.url, solo.json()["secret"]) == 200
        assert status(gw.url, SOLO_KEY) == 401
        report = admin(gw.url, "GET", "/admin/usage", by="key").json()["rows"]  # rows still queued
        assert query(url, "SELECT count(*) FROM requests") == [(0,)]
    rows = query(url, "SELECT key_name, key_id, team FROM requests WHERE status = 200 ORDER BY ts")
    assert [(name, team) for name, _, team in rows] == [
        ("ci", "red"),  # revoked before it was written: still its team
        ("alice", "blue"),
        ("solo", ""),
        ("alice", "green"),  # moved by the reload: the new team from then on
        ("solo", ""),
    ]
    ids = [key_id for _, key_id, _ in rows]
    assert ids[0] == made["key"]["id"] and ids[1] == ids[3] and ids[1].startswith("cfg_")
    assert ids[2].startswith("cfg_") and ids[4] == solo.json()["key"]["id"] and ids[2] != ids[4]
    # The report told the two keys named solo apart, as the rollups do.
    assert sorted(r["key_id"][:4] for r in report if r["key"] == "solo") == ["cfg_", "key_"]
    rolled = query(url, "SELECT key_id, requests FROM daily WHERE key_name = 'solo' ORDER BY key_id")
    assert [(k[:4], n) for k, n in rolled] == [("cfg_", 1), ("key_", 1)]


NO_KEYS = """
admin: {{key: "${{LEDGER_ADMIN_KEY}}"}}
logging: {{requests: false}}
ledger: {{url: "{url}", flush_ms: 100, keys_poll_ms: 200}}
{keyless}
providers:
  demo: {{kind: fake, models: [long]}}
"""


def test_revoking_the_last_runtime_key_never_opens_the_gateway(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in ENV.items():  # a reload reads the process's environment
        monkeypatch.setenv(name, value)
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    path = tmp_path / "config.yaml"
    path.write_text(NO_KEYS.format(url=url, keyless=""))
    caplog.set_level(logging.INFO, logger="gateway")
    with GatewayThread(path, ENV) as gw:
        assert status(gw.url, None) == 200  # never had a key: open
        made = admin(gw.url, "POST", "/admin/keys", {"name": "first"}).json()
        assert status(gw.url, None) == 401 and status(gw.url, made["secret"]) == 200
        assert admin(gw.url, "DELETE", f"/admin/keys/{made['key']['id']}").status_code == 200
        assert status(gw.url, made["secret"]) == 401
        time.sleep(0.5)  # past a poll of the keys
        assert status(gw.url, None) == 401  # still closed
        reload_to(gw, path, NO_KEYS.format(url=url, keyless="keyless: open"), lambda cfg: cfg.keyless == "open")
        assert status(gw.url, None) == 200  # the operator said so in the config
        reload_to(gw, path, NO_KEYS.format(url=url, keyless="keyless: closed"), lambda cfg: cfg.keyless == "closed")
        assert status(gw.url, None) == 401
    # The first runtime key closed the gateway: said once, when it was loaded.
    changed = [r.getMessage() for r in caplog.records if r.getMessage().startswith("runtime keys changed: ")]
    assert changed == [
        "runtime keys changed: client keys: 0 in the config, 1 runtime key(s) in the ledger: "
        "requests without a key are refused"
    ]
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("config reload: ")]
    assert "config reload: no client keys configured: the gateway is open to anyone who can reach it" in said
    assert (
        "config reload: client keys: 0 in the config, 0 runtime key(s) in the ledger (keyless: closed): "
        "requests without a key are refused"
    ) in said
    # A new process on the same ledger starts closed, and says why.
    path.write_text(NO_KEYS.format(url=url, keyless=""))
    gw2 = GatewayProcess(path, cli_env(**ENV))
    try:
        gw2.wait_ready()
        assert status(gw2.url, None) == 401
    finally:
        gw2.stop()
    assert (
        "INFO gateway" in gw2.log.read_text()
        and "client keys: 0 in the config, 0 runtime key(s) in the ledger (the ledger has held runtime keys; "
        "keyless: auto): requests without a key are refused"
        in gw2.log.read_text()
    )


def test_a_second_rotation_keeps_the_first_secrets_grace(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    path = tmp_path / "config.yaml"
    path.write_text(config(url))
    with GatewayThread(path, ENV) as gw:
        made = admin(gw.url, "POST", "/admin/keys", {"name": "rotor"}).json()
        key_id, first = made["key"]["id"], made["secret"]
        second = admin(gw.url, "POST", f"/admin/keys/{key_id}/rotate", {"grace_s": 60}).json()["secret"]
        rotated = admin(gw.url, "POST", f"/admin/keys/{key_id}/rotate", {"grace_s": 1})
        third = rotated.json()["secret"]
        until = rotated.json()["key"]["rotated_grace_until"]
        assert until == pytest.approx(time.time() + 60, abs=5)  # the latest grace among the earlier secrets
        assert [status(gw.url, s) for s in (first, second, third)] == [200, 200, 200]
        wait_until(lambda: status(gw.url, second) == 401, timeout=4)
        assert status(gw.url, first) == 200 and status(gw.url, third) == 200  # the first keeps its minute
        assert admin(gw.url, "DELETE", f"/admin/keys/{key_id}").status_code == 200
        wait_until(lambda: status(gw.url, first) == 401 and status(gw.url, third) == 401, timeout=2)
    assert query(url, "SELECT count(*) FROM key_secrets") == [(0,)]  # a revoked key keeps no secret


def test_csv_cells_that_start_like_a_formula_are_quoted(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    path = tmp_path / "config.yaml"
    path.write_text(config(url, flush_ms=60_000))
    with GatewayThread(path, ENV) as gw:
        made = admin(gw.url, "POST", "/admin/keys", {"name": "@ops", "team": "-red"}).json()
        with client(gw.url, made["secret"]) as c:
            assert c.post("/v1/completions", json=body()).status_code == 200
            assert c.post("/v1/completions", json=body(model="=1+2")).status_code == 404
        reports = {
            by: admin(gw.url, "GET", "/admin/usage", by=by, format="csv").text for by in ("key", "team", "model")
        }
    # The operator's report names a team's runtime key `team/name`: here `-red/@ops`, quoted.
    assert "\n" + time.strftime("%Y-%m-%d", time.gmtime()) + ",'-red/@ops,key_" in reports["key"]
    assert ",'-red," in reports["team"] and ",-red," not in reports["team"]
    # A model name is client text only in the request's own row: the rollups book it under the config's names.
    assert "=1+2" not in reports["model"] and ",unknown,1,1," in reports["model"]


def at_version_3(url: str, new: str, old: str) -> None:
    """A ledger as the gateway before key identities left it: a rollup, a key rotated a minute ago."""
    db = Database(url)

    def run(cur: Cursor) -> None:
        cur.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
        for version, statements in enumerate(MIGRATIONS[:3], start=1):
            for statement in statements:
                cur.execute(statement if isinstance(statement, str) else statement[db.engine])
            cur.execute("INSERT INTO schema_version (version) VALUES (?)", (version,))
        cur.execute(
            "INSERT INTO daily (day, key_name, team, model, target, requests, errors, prompt_tokens, "
            "completion_tokens, cost_pico) VALUES ('2026-11-01', 'alice', 'blue', 'fast', 'demo/long', 5, 1, 15, 35, "
            "85)"
        )
        cur.execute(
            "INSERT INTO api_keys (id, name, team, models, digest, old_digest, old_valid_until, created_at) "
            "VALUES ('key_old', 'veteran', NULL, '[\"**\"]', ?, ?, ?, 0)",
            (hashlib.sha256(new.encode()).hexdigest(), hashlib.sha256(old.encode()).hexdigest(), time.time() + 60),
        )

    try:
        db.transaction(run)
    finally:
        db.close()


def migrated(tmp_path: Path, url: str) -> None:
    new, old = "gwk-veteran-new-1a", "gwk-veteran-old-2b"
    at_version_3(url, new, old)
    path = tmp_path / "config.yaml"
    path.write_text(config(url))
    with GatewayThread(path, ENV) as gw:
        assert status(gw.url, new) == 200 and status(gw.url, old) == 200  # the rotation's grace survives
        rows = admin(gw.url, "GET", "/admin/usage", **{"from": "2026-11-01", "by": "key"}).json()["rows"]
        assert rows == [
            {
                "day": "2026-11-01",
                "key": "alice",
                "key_id": "",
                "requests": 5,
                "errors": 1,
                "prompt_tokens": 15,
                "completion_tokens": 35,
                "cost": 85 / 10**12,
            }
        ]
        third = admin(gw.url, "POST", "/admin/keys/key_old/rotate", {"grace_s": 1}).json()["secret"]
        assert [status(gw.url, s) for s in (old, new, third)] == [200, 200, 200]
    assert query(url, "SELECT max(version) FROM schema_version")[0][0] == len(MIGRATIONS)
    assert query(url, "SELECT key_id, cached FROM daily WHERE day = '2026-11-01'") == [("", 0)]


def test_a_ledger_of_the_previous_schema_keeps_its_rollups_and_graces_sqlite(tmp_path: Path) -> None:
    migrated(tmp_path, f"sqlite:///{tmp_path / 'ledger.db'}")


def test_a_ledger_of_the_previous_schema_keeps_its_rollups_and_graces_postgres(
    tmp_path: Path, pg: PostgresServer
) -> None:
    migrated(tmp_path, pg.url)
