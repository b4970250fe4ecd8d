"""A team's rate limits (`teams.<name>.limits`), shared by all of its keys, over real sockets.

Two gateways (uvicorn in threads) share one real redis-server and one SQLite ledger, so a team's YAML keys and
a runtime key its admin made draw on one bucket across both; then one gateway without Redis, in process. Limits
are chosen so that nothing refills while a test runs (rpm 4 drips one back every 15 s), which makes every count
exact. The fake provider reports usage.prompt_tokens = the prompt's words, and `demo/text` writes 8 to 47 words
whatever `max_tokens` allows above that, so a reservation of 203 tokens settles to less.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Final

import httpx
import pytest

from gateway.limits.gcra import Bucket
from gateway.limits.refusal import TEAM_HEADER, team_refused
from tests.helpers.clients import body, client, limit_headers
from tests.helpers.identity import bucket
from tests.helpers.redis import RedisServer
from tests.helpers.servers import GatewayThread, serve_config
from tests.helpers.waiting import wait_until

ADMIN: Final = "adm-team-limits-4e1a"
RED_ADMIN: Final = "adm-team-red-9b03"
ENV: Final = {"TL_ADMIN": ADMIN, "TL_RED_ADMIN": RED_ADMIN}
TEAM_MESSAGE: Final = "Rate limit reached for team '{}', shared by all of its keys; retry after the time in Retry-After"
KEY_MESSAGE: Final = "Rate limit reached for this key or model; retry after the time in Retry-After"

CONFIG: Final = """
redis: {{url: "{redis}", on_failure: fail_closed}}
admin: {{key: "${{TL_ADMIN}}"}}
logging: {{requests: false}}
ledger: {{url: "{ledger}", keys_poll_ms: 200}}
keys:
  - {{name: red-1, key: k-red-1, team: red, limits: {{rpm: 100}}}}
  - {{name: red-2, key: k-red-2, team: red}}
  - {{name: green-1, key: k-green-1, team: green}}
  - {{name: green-2, key: k-green-2, team: green}}
  - {{name: tight, key: k-tight, team: roomy, limits: {{rpm: 1}}}}
  - {{name: tok-1, key: k-tok-1, team: tok, limits: {{tpm: 6000}}}}
  - {{name: blue-1, key: k-blue-1, team: blue}}
  - {{name: slot-1, key: k-slot-1, team: slots}}
  - {{name: slot-2, key: k-slot-2, team: slots}}
  - {{name: solo, key: k-solo}}
teams:
  red: {{limits: {{rpm: 4}}, admin_key: "${{TL_RED_ADMIN}}"}}
  green: {{limits: {{rpm: 6}}}}
  roomy: {{limits: {{rpm: 1000}}}}
  tok: {{limits: {{tpm: 1000}}}}
  slots: {{limits: {{concurrent: 2}}}}
  blue: {{}}
providers:
  demo: {{kind: fake}}
"""


def post(
    gw: GatewayThread, key: str, payload: dict[str, Any] | None = None, route: str = "/v1/completions"
) -> httpx.Response:
    with client(gw.url, key) as c:
        return c.post(route, json=payload or body())


def units(rds: RedisServer, key: str) -> float:
    """Units charged to a rate bucket since it was last empty (the script stores `ms:units`)."""
    with rds.client() as r:
        raw = r.get(key)
    assert raw is not None, key
    return float(raw.split(":")[1])


def team_bucket(team: str, kind: str) -> str:
    return "rl:{team:" + team + "}:" + kind


def full_in_ms(rds: RedisServer, key: str, limit: int) -> float:
    """How far a minute bucket's TAT is ahead of Redis's clock: what it has admitted, in ms of its rate (the
    script stores `ms:units` with the units below one period's worth, so a full bucket's units read 0)."""
    with rds.client() as r:
        raw = r.get(key)
    assert raw is not None, key
    base, units = raw.split(":")
    return float(base) + float(units) * 60_000 / limit - rds.time_ms()


@pytest.fixture(scope="module")
def pair(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[GatewayThread]]:
    base = tmp_path_factory.mktemp("team-limits")
    path = base / "config.yaml"
    path.write_text(CONFIG.format(redis=redis_server.url, ledger=f"sqlite:///{base / 'ledger.db'}"))
    with GatewayThread(path, ENV) as a, GatewayThread(path, ENV) as b:
        yield [a, b]


@pytest.fixture
def gws(pair: list[GatewayThread], rds: RedisServer) -> list[GatewayThread]:
    """Both gateways over an empty Redis."""
    return pair


def test_a_teams_keys_share_its_rpm_across_two_gateways(gws: list[GatewayThread], rds: RedisServer) -> None:
    a, b = gws
    made = post(a, RED_ADMIN, {"name": "red-bot"}, "/admin/keys")
    assert made.status_code == 201, made.text
    assert made.json()["key"]["team"] == "red"
    runtime = made.json()["secret"]
    # Known on b once its unknown model is a 404 rather than its secret a 401 (no bucket is charged either way).
    wait_until(lambda: post(b, runtime, body(model="nope/x")).status_code == 404, timeout=3)

    # rpm 4 for the team: a YAML key with a larger limit of its own, a YAML key without one and the runtime key
    # share it, whichever gateway they call; the headers show the team's bucket, the tightest.
    first = post(a, "k-red-1")
    assert first.status_code == 200, first.text
    h = limit_headers(first)
    assert (h["x-ratelimit-limit-requests"], h["x-ratelimit-remaining-requests"]) == ("4", "3")
    assert [post(b, "k-red-2").status_code, post(a, runtime).status_code, post(b, "k-red-1").status_code] == [200] * 3
    for gw, key in ((a, "k-red-2"), (b, runtime), (a, "k-red-1")):
        refused = post(gw, key)
        assert refused.status_code == 429, refused.text
        assert refused.json()["error"] == {
            "message": TEAM_MESSAGE.format("red"),
            "type": "rate_limit_error",
            "param": None,
            "code": "rate_limit_exceeded",
        }
        assert refused.headers[TEAM_HEADER] == "red"
        assert 10 <= int(refused.headers["retry-after"]) <= 15  # four of rpm 4: one drips back 15 s after the first
        h = limit_headers(refused)
        assert (h["x-ratelimit-limit-requests"], h["x-ratelimit-remaining-requests"]) == ("4", "0")
    # Four requests charged (a request is 15 s of rpm 4's TAT), the refused ones nothing.
    assert 50_000 < full_in_ms(rds, team_bucket("red", "rpm"), 4) <= 60_000
    assert units(rds, bucket("k-red-1", "rpm")) == 2  # the key's own bucket counts its own two
    # Another team's key, and a key of no team, are not held by red's bucket.
    for key in ("k-blue-1", "k-solo", "k-green-1"):
        assert post(a, key).status_code == 200 and post(b, key).status_code == 200, key


def test_a_burst_over_two_gateways_admits_exactly_the_teams_rpm(gws: list[GatewayThread], rds: RedisServer) -> None:
    a, b = gws
    calls = [(gw, key) for _ in range(6) for gw in (a, b) for key in ("k-green-1", "k-green-2")]

    def one(call: tuple[GatewayThread, str]) -> httpx.Response:
        gw, key = call
        return post(gw, key)

    with ThreadPoolExecutor(12) as pool:
        results = list(pool.map(one, calls))
    assert sorted(r.status_code for r in results) == [200] * 6 + [429] * 18
    assert all(r.headers[TEAM_HEADER] == "green" for r in results if r.status_code == 429)
    assert 50_000 < full_in_ms(rds, team_bucket("green", "rpm"), 6) <= 60_000


def test_a_teams_concurrent_holds_across_two_gateways(gws: list[GatewayThread], rds: RedisServer) -> None:
    a, b = gws
    calls = [(gw, key) for gw in (a, b) for key in ("k-slot-1", "k-slot-2") for _ in range(2)]

    def one(call: tuple[GatewayThread, str]) -> httpx.Response:
        gw, key = call
        return post(gw, key, body("demo/slow-3000ms"))

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, calls))
    assert sorted(r.status_code for r in results) == [200] * 2 + [429] * 6
    assert all(r.headers[TEAM_HEADER] == "slots" for r in results if r.status_code == 429)
    # Every slot is given back when its request ends.
    with rds.client() as r:
        wait_until(lambda: r.zcount(team_bucket("slots", "concurrent"), "(0", "+inf") == 0)
    assert post(b, "k-slot-2").status_code == 200


def test_the_keys_own_limit_is_named_as_the_keys(gws: list[GatewayThread]) -> None:
    a, b = gws
    assert post(a, "k-tight").status_code == 200
    refused = post(b, "k-tight")
    assert refused.status_code == 429 and refused.json()["error"]["message"] == KEY_MESSAGE
    assert TEAM_HEADER not in refused.headers
    assert 55 <= int(refused.headers["retry-after"]) <= 60


def test_the_tpm_settle_charges_the_team(gws: list[GatewayThread], rds: RedisServer) -> None:
    a, _ = gws
    resp = post(a, "k-tok-1", body("demo/text", max_tokens=200))
    assert resp.status_code == 200, resp.text
    # Reserved 3 + 200 on the team's tpm 1000 (the tightest) and on the key's own tpm 6000.
    assert limit_headers(resp)["x-ratelimit-remaining-tokens"] == str(1000 - 203)
    used = resp.json()["usage"]["total_tokens"]
    assert used < 203
    wait_until(lambda: units(rds, team_bucket("tok", "tpm")) == used)
    wait_until(lambda: units(rds, bucket("k-tok-1", "tpm")) == used)


def test_the_status_page_shows_a_teams_buckets(gws: list[GatewayThread]) -> None:
    a, _ = gws
    with client(a.url, ADMIN) as c:
        limits = c.get("/admin/status").json()["limits"]
    assert {(s["scope"], s["kind"], s["limit"]) for s in limits if s["scope"].startswith("team:")} == {
        ("team:red", "rpm", 4),
        ("team:green", "rpm", 6),
        ("team:roomy", "rpm", 1000),
        ("team:tok", "tpm", 1000),
        ("team:slots", "concurrent", 2),
    }


IN_PROCESS: Final = """
keys:
  - {name: p1, key: k-p1, team: pod}
  - {name: p2, key: k-p2, team: pod}
  - {name: q1, key: k-q1, team: other}
teams:
  pod: {limits: {rpm: 3, tpm: 100}}
  other: {}
providers:
  demo: {kind: fake}
"""


def test_a_teams_limits_in_process(tmp_path: Path) -> None:
    with serve_config(tmp_path, IN_PROCESS) as gw:
        calls = ["k-p1", "k-p2"] * 4

        def one(key: str) -> httpx.Response:
            return post(gw, key)

        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(one, calls))
        assert sorted(r.status_code for r in results) == [200] * 3 + [429] * 5
        refused = [r for r in results if r.status_code == 429]
        assert all(r.headers[TEAM_HEADER] == "pod" for r in refused)
        assert refused[0].json()["error"]["message"] == TEAM_MESSAGE.format("pod")
        assert post(gw, "k-q1").status_code == 200
        # Three admitted requests of 10 tokens each, settled to their usage (reserved as used: demo/long).
        local = gw.pipeline.admission.limiter.local
        assert local.tat[team_bucket("pod", "tpm")][1] == 30


def test_which_bucket_refused_is_read_off_the_reply() -> None:
    key_rpm, team_rpm = Bucket("key:a", "rpm", 10), Bucket("team:t", "rpm", 4)
    key_slots, team_slots = Bucket("key:a", "concurrent", 2), Bucket("team:t", "concurrent", 3)
    team_tpm = Bucket("team:t", "tpm", 1000)
    assert team_refused("t", [key_rpm, team_rpm], [5, 0], 0)
    assert not team_refused("t", [key_rpm, team_rpm], [0, 2], 0)
    assert team_refused("t", [key_rpm, team_tpm], [3, 99], 100)  # 100 tokens do not fit in 99
    assert not team_refused("t", [key_rpm, team_tpm], [0, 100], 100)
    # A concurrency bucket reads 0 when full and when this request would have taken its last slot: the team's is
    # named only when no other bucket can have refused.
    assert team_refused("t", [key_rpm, team_slots], [5, 0], 0)
    assert not team_refused("t", [key_rpm, team_slots], [0, 0], 0)
    assert not team_refused("t", [key_slots, team_slots], [0, 0], 0)
    assert team_refused("t", [key_slots, team_rpm], [0, 0], 0)
