"""Keys made at runtime: create, use, rotate with a grace period, revoke, on two replicas sharing one ledger.

Both replicas are the real gateway (uvicorn in threads) on one SQLite file; the PostgreSQL engine runs the
same lifecycle in tests/ledger/test_postgres.py. A change made through one replica must apply on the
other within 2 s (`ledger.keys_poll_ms` is 200 here).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import pytest

from gateway.config import QUEUE_MAX_MS, RATE_MAX, KeyConfig
from gateway.edge.ledger_routes import NewKey
from gateway.ledger.schema import MIGRATIONS
from tests.helpers.clients import body, client
from tests.helpers.postgres import PostgresServer
from tests.helpers.servers import GatewayThread, cli_env, run_cli
from tests.helpers.sqlite import opened
from tests.helpers.waiting import wait_until

from .conftest import ADMIN_KEY, ENV, config, query

PROPAGATION_S = 2.0


def status(url: str, key: str) -> int:
    with client(url, key) as c:
        return c.post("/v1/completions", json=body()).status_code


def admin(url: str, method: str, path: str, json: Any = None) -> Any:
    with client(url, ADMIN_KEY) as c:
        return c.request(method, path, json=json)


def lifecycle(a: str, b: str, db_url: str) -> None:
    """create -> use on both -> rotate (old valid through its grace, then 401) -> revoke (401 on both)."""
    resp = admin(a, "POST", "/admin/keys", {"name": "ci-bot", "team": "red", "models": ["demo/*"]})
    assert resp.status_code == 201, resp.text
    made = resp.json()
    first, key_id = made["secret"], made["key"]["id"]
    assert made["key"]["name"] == "ci-bot" and made["key"]["team"] == "red"
    assert status(a, first) == 200  # at once on the replica that made it
    started = time.monotonic()
    wait_until(lambda: status(b, first) == 200, timeout=PROPAGATION_S)
    assert time.monotonic() - started < PROPAGATION_S
    with client(a, first) as c:  # the key's own model globs apply
        assert c.post("/v1/completions", json=body(model="fast")).status_code == 403
    # The ledger keeps the digest, never the secret; the listing shows neither.
    stored = query(db_url, "SELECT digest FROM api_keys")
    assert first not in repr(stored)
    listed = admin(b, "GET", "/admin/keys").json()["keys"]
    assert [k["id"] for k in listed] == [key_id] and first not in repr(listed) and "digest" not in listed[0]

    resp = admin(b, "POST", f"/admin/keys/{key_id}/rotate", {"grace_s": 2})
    assert resp.status_code == 200, resp.text
    second = resp.json()["secret"]
    assert second != first and resp.json()["key"]["id"] == key_id
    wait_until(lambda: status(a, second) == 200, timeout=PROPAGATION_S)
    assert status(a, first) == 200 and status(b, first) == 200  # the old secret, within its grace
    wait_until(lambda: status(a, first) == 401 and status(b, first) == 401, timeout=4)
    assert status(a, second) == 200 and status(b, second) == 200

    resp = admin(a, "DELETE", f"/admin/keys/{key_id}")
    assert resp.status_code == 200, resp.text
    started = time.monotonic()
    wait_until(lambda: status(a, second) == 401 and status(b, second) == 401, timeout=PROPAGATION_S)
    assert time.monotonic() - started < PROPAGATION_S
    assert admin(a, "GET", "/admin/keys").json() == {"keys": []}
    assert admin(a, "DELETE", f"/admin/keys/{key_id}").status_code == 404
    # Its requests were booked under its name and team.
    booked = "SELECT count(*) FROM requests WHERE key_name = 'ci-bot' AND team = 'red'"
    wait_until(lambda: query(db_url, booked)[0][0] > 0)


@pytest.fixture
def replicas(tmp_path: Path) -> Iterator[tuple[GatewayThread, GatewayThread, str]]:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    path = tmp_path / "config.yaml"
    path.write_text(config(url))
    with GatewayThread(path, ENV) as a, GatewayThread(path, ENV) as b:
        yield a, b, url


def test_key_lifecycle_on_two_replicas(replicas: tuple[GatewayThread, GatewayThread, str]) -> None:
    a, b, url = replicas
    lifecycle(a.url, b.url, url)


def test_bad_requests_name_the_field(replicas: tuple[GatewayThread, GatewayThread, str]) -> None:
    a, _, _ = replicas
    resp = admin(a.url, "POST", "/admin/keys", {"name": "x y"})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "name", resp.text
    # A final newline is not one of a name's characters: "alice\n" would sit beside the YAML key "alice", and
    # "anonymous\n" beside the name keyless requests are booked under.
    for spec, param in (
        ({"name": "alice\n"}, "name"),
        ({"name": "anonymous\n"}, "name"),
        ({"name": "ok", "team": "red\n"}, "team"),
    ):
        resp = admin(a.url, "POST", "/admin/keys", spec)
        assert resp.status_code == 400 and resp.json()["error"]["param"] == param, resp.text
    resp = admin(a.url, "POST", "/admin/keys", {"name": "ok", "max_cost_per_day": -1})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "max_cost_per_day", resp.text
    resp = admin(a.url, "POST", "/admin/keys", {"name": "ok", "secret": "chosen"})
    assert resp.status_code == 400, resp.text
    # A budget that would not count in 64-bit picodollars (every request of the key was a 500).
    for field in ("max_cost_per_day", "max_cost_per_month"):
        resp = admin(a.url, "POST", "/admin/keys", {"name": "ok", field: 1e308})
        assert resp.status_code == 400 and resp.json()["error"]["param"] == field, resp.text
    # A YAML key's name, or a runtime key's, is taken; so is the name keyless requests are booked under.
    taken = admin(a.url, "POST", "/admin/keys", {"name": "alice"})
    assert taken.status_code == 409
    assert taken.json()["error"] | {"message": ""} == {
        "message": "",
        "type": "invalid_request_error",
        "param": "name",
        "code": "key_exists",
    }
    assert admin(a.url, "POST", "/admin/keys", {"name": "anonymous"}).status_code == 409
    assert admin(a.url, "POST", "/admin/keys", {"name": "bob"}).status_code == 201
    assert admin(a.url, "POST", "/admin/keys", {"name": "bob"}).status_code == 409
    assert admin(a.url, "POST", "/admin/keys/key_nope/rotate").status_code == 404
    with client(a.url, "not-the-admin-key") as c:
        assert c.get("/admin/keys").status_code == 401


def test_expiry(replicas: tuple[GatewayThread, GatewayThread, str]) -> None:
    a, b, _ = replicas
    # The expiry runs from the moment the replica takes the request: 3 s leaves room for making the key and
    # sending the first request on a loaded machine, where that alone can take more than a second.
    made = admin(a.url, "POST", "/admin/keys", {"name": "brief", "expires_in_s": 3}).json()
    secret, expires_at = made["secret"], made["key"]["expires_at"]
    sent = time.time()
    assert status(a.url, secret) == 200, f"sent {expires_at - sent:.2f} s before its expiry"
    wait_until(
        lambda: status(a.url, secret) == 401 and status(b.url, secret) == 401, timeout=expires_at - time.time() + 4
    )
    assert time.time() >= expires_at, "refused before its expiry"


def test_a_runtime_key_named_like_a_yaml_key_is_a_start_up_error(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    path = tmp_path / "config.yaml"
    path.write_text(config(f"sqlite:///{db}").replace("name: solo", "name: later"))
    with GatewayThread(path, ENV) as gw:
        assert admin(gw.url, "POST", "/admin/keys", {"name": "solo"}).status_code == 201
    path.write_text(config(f"sqlite:///{db}"))  # the YAML now names a key `solo` too
    result = run_cli(["serve", "--config", str(path), "--port", "0"], env=cli_env(**ENV))
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        f"config error: {path}: keys: 'solo' also named by a runtime key in the ledger "
        "(rename the YAML key or revoke the runtime one)"
    )


def test_key_lifecycle_on_postgres(tmp_path: Path, pg: PostgresServer) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(config(pg.url, extra=f', spill_dir: "{tmp_path / "spill"}"'))
    with GatewayThread(path, ENV) as a, GatewayThread(path, ENV) as b:
        lifecycle(a.url, b.url, pg.url)


def test_a_runtime_keys_own_limits_and_budget(replicas: tuple[GatewayThread, GatewayThread, str]) -> None:
    a, b, _ = replicas
    spec = {"name": "metered", "limits": {"rpm": 2}, "max_cost_per_day": 1.0}
    made = admin(a.url, "POST", "/admin/keys", spec)
    assert made.status_code == 201, made.text
    assert made.json()["key"]["limits"]["rpm"] == 2
    secret = made.json()["secret"]
    with client(a.url, secret) as c:
        assert [c.post("/v1/completions", json=body()).status_code for _ in range(2)] == [200, 200]
        refused = c.post("/v1/completions", json=body())
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "rate_limit_exceeded"
    bad = admin(a.url, "POST", "/admin/keys", {"name": "m2", "limits": {"rpm": 0}})
    assert bad.status_code == 400, bad.text
    # A runtime key's budget: $0.017 per request, so a $0.02 budget admits two.
    secret = admin(b.url, "POST", "/admin/keys", {"name": "thrifty", "max_cost_per_day": 0.02}).json()["secret"]
    wait_until(lambda: status(a.url, secret) != 401, timeout=PROPAGATION_S)  # the first one served: $0.017
    assert status(a.url, secret) == 200  # $0.017 < $0.02
    assert status(a.url, secret) == 429  # $0.034


def test_a_runtime_key_takes_every_field_a_yaml_key_does() -> None:
    # The secret is made by the gateway; everything else a YAML key may set, a runtime key may too.
    assert set(KeyConfig.__struct_fields__) - {"key"} <= set(NewKey.__struct_fields__)


QUEUED: Final = "gk-ledger-queued-5d27"
LIMITS: Final = {"rps": 1, "max_queue_ms": 3000}


def test_a_runtime_keys_limits_and_monthly_budget_as_a_yaml_keys(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    path = tmp_path / "config.yaml"
    yaml_key = f'  - {{name: yaml-queued, key: "${{LEDGER_QUEUED}}", limits: {json.dumps(LIMITS)}}}\n'
    path.write_text(config(url).replace("keys:\n", "keys:\n" + yaml_key))
    with GatewayThread(path, {**ENV, "LEDGER_QUEUED": QUEUED}) as gw:
        spec = {"name": "queued", "limits": LIMITS, "max_cost_per_month": 0.02, "team": "red"}
        made = admin(gw.url, "POST", "/admin/keys", spec)
        assert made.status_code == 201, made.text
        assert made.json()["key"]["limits"]["max_queue_ms"] == 3000
        assert made.json()["key"]["max_cost_per_month"] == 0.02
        listed = admin(gw.url, "GET", "/admin/keys").json()["keys"]
        assert [(k["name"], k["limits"], k["max_cost_per_month"]) for k in listed] == [
            ("queued", LIMITS | {"rpm": None, "tpm": None, "tpd": None, "concurrent": None}, 0.02)
        ]
        assert made.json()["secret"] not in repr(listed) and "digest" not in listed[0]
        # rps 1 with a 3 s queue: a second request at once waits for room (about 1 s) instead of a 429,
        # for the runtime key exactly as for the YAML key with the same block.
        for secret in (QUEUED, made.json()["secret"]):
            with client(gw.url, secret) as c:
                assert c.post("/v1/completions", json=body()).status_code == 200
                started = time.monotonic()
                assert c.post("/v1/completions", json=body()).status_code == 200
                assert 0.5 < time.monotonic() - started < 2.5
        # Without the queue, the same key answers 429 at once.
        bare = admin(gw.url, "POST", "/admin/keys", {"name": "bare", "limits": {"rps": 1}}).json()["secret"]
        with client(gw.url, bare) as c:
            assert c.post("/v1/completions", json=body()).status_code == 200
            assert c.post("/v1/completions", json=body()).status_code == 429
        # $0.017 a request against $0.02 a month: the second still fits ($0.017 spent), the third does not.
        with client(gw.url, made.json()["secret"]) as c:
            time.sleep(1.0)  # its rps bucket full again, so the refusal below is the budget's
            refused = c.post("/v1/completions", json=body())
        assert refused.status_code == 429
        assert refused.json()["error"]["code"] == "budget_exceeded"
        assert refused.json()["error"]["message"].startswith(
            "Key 'queued' has reached its monthly budget of $0.02 ($0.034 spent this month, UTC)"
        ), refused.text


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"max_cost_per_month": -0.5}, "max_cost_per_month"),
        ({"limits": {"max_queue_ms": -1}}, "limits.max_queue_ms"),
        ({"limits": {"rps": 0}}, "limits.rps"),
        ({"limits": {"burst": 3}}, "limits.burst"),  # an unknown field, named with its path
        ({"name_of_key": "x"}, "name_of_key"),
        ({"max_cost_per_month": "lots"}, "max_cost_per_month"),
        # Numbers past a float's range, or past a rate that limits anything, or a century of life.
        ({"limits": {"rpm": 10**13}}, "limits.rpm"),
        ({"limits": {"tpd": 10**400}}, "limits.tpd"),
        ({"limits": {"concurrent": RATE_MAX + 1}}, "limits.concurrent"),
        ({"limits": {"concurrent": 10**400}}, "limits.concurrent"),
        ({"limits": {"max_queue_ms": QUEUE_MAX_MS + 1}}, "limits.max_queue_ms"),
        ({"expires_in_s": 10**400}, "expires_in_s"),
        ({"expires_in_s": 101 * 365 * 86_400}, "expires_in_s"),
    ],
)
def test_a_bad_limit_is_a_400_naming_it(
    replicas: tuple[GatewayThread, GatewayThread, str], spec: Any, field: str
) -> None:
    a, _, _ = replicas
    resp = admin(a.url, "POST", "/admin/keys", {"name": "bad", **spec})
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == field, resp.text
    assert field.split(".")[-1] in resp.json()["error"]["message"], resp.text
    assert admin(a.url, "GET", "/admin/keys").json() == {"keys": []}


def test_keys_made_before_monthly_budgets_keep_working_after_the_upgrade(tmp_path: Path) -> None:
    """A ledger at schema version 2 (runtime keys without `max_cost_per_month`) is migrated at start."""
    db = tmp_path / "ledger.db"
    secret = "gwk-made-by-an-older-gateway"
    with opened(db) as conn:
        conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
        for version, statements in enumerate(MIGRATIONS[:2], start=1):
            for statement in statements:
                conn.execute(statement if isinstance(statement, str) else statement["sqlite"])
            conn.execute("INSERT INTO schema_version (version) VALUES (?)", (version,))
        conn.execute(
            "INSERT INTO api_keys (id, name, team, models, max_cost_per_day, expires_at, digest, created_at, limits) "
            "VALUES ('key_old', 'veteran', NULL, '[\"**\"]', NULL, NULL, ?, 0, '{\"rpm\": 5}')",
            (hashlib.sha256(secret.encode()).hexdigest(),),
        )
    path = tmp_path / "config.yaml"
    path.write_text(config(f"sqlite:///{db}"))
    with GatewayThread(path, ENV) as gw:
        assert status(gw.url, secret) == 200
        [listed] = admin(gw.url, "GET", "/admin/keys").json()["keys"]
    assert listed["name"] == "veteran" and listed["max_cost_per_month"] is None and listed["limits"]["rpm"] == 5
    assert query(f"sqlite:///{db}", "SELECT max(version) FROM schema_version")[0][0] == len(MIGRATIONS)


def test_a_runtime_keys_share_of_a_saturated_server_as_a_yaml_keys(tmp_path: Path) -> None:
    # A server with max_concurrency turns the priority header on; a runtime key's priorities decide it.
    path = tmp_path / "config.yaml"
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    path.write_text(config(url).replace("models: [long, text]}", "models: [long, text], max_concurrency: 4}"))
    with GatewayThread(path, ENV) as gw:
        spec = {"name": "urgent", "weight": 3, "priority": "high", "max_priority": "high"}
        made = admin(gw.url, "POST", "/admin/keys", spec)
        assert made.status_code == 201, made.text
        assert (made.json()["key"]["weight"], made.json()["key"]["priority"]) == (3, "high")
        plain = admin(gw.url, "POST", "/admin/keys", {"name": "plain"}).json()["secret"]
        listed = {k["name"]: k for k in admin(gw.url, "GET", "/admin/keys").json()["keys"]}
        assert (listed["urgent"]["weight"], listed["urgent"]["max_priority"]) == (3, "high")
        assert (listed["plain"]["weight"], listed["plain"]["max_priority"]) == (1, None)
        high = {"x-gateway-priority": "high"}
        with client(gw.url, made.json()["secret"]) as c:
            assert c.post("/v1/completions", json=body(), headers=high).status_code == 200
        with client(gw.url, plain) as c:
            refused = c.post("/v1/completions", json=body(), headers=high)
            assert refused.status_code == 403 and refused.json()["error"]["code"] == "priority_not_allowed"
        above = admin(gw.url, "POST", "/admin/keys", {"name": "x", "priority": "high", "max_priority": "low"})
        assert above.status_code == 400 and above.json()["error"]["param"] == "priority"
        bad = admin(gw.url, "POST", "/admin/keys", {"name": "y", "weight": 0})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "weight"
