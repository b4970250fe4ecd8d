"""`GET /admin/batches/{id}` and `POST /admin/batches/{id}/cancel`: one batch, for an admin without its key.

Over real sockets, on a real SQLite file and on PostgreSQL: the operator reads and cancels any key's batch (the
object `GET /admin/batches` lists, the cancel `POST /v1/batches/{id}/cancel` makes); a team's admin its team's
keys' (YAML and runtime, revoked ones too) alone, another team's batch, a batch of a key of no team and an
unknown id being the same 404; without a ledger, the listing's 404.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

import httpx
import pytest

from tests.helpers.clients import client
from tests.helpers.servers import GatewayThread

from .conftest import ADMIN_KEY, ENV, EVAL_KEY, OTHER_KEY, config, jsonl, line

BLUE_ADMIN: Final = "adm-batches-blue-93f0"
GREEN_ADMIN: Final = "adm-batches-green-1b7d"
TEAM_ENV: Final = {**ENV, "BLUE_ADMIN": BLUE_ADMIN, "GREEN_ADMIN": GREEN_ADMIN}
TEAMS: Final = 'teams: {blue: {admin_key: "${BLUE_ADMIN}"}, green: {admin_key: "${GREEN_ADMIN}"}}'
EVAL_LINE: Final = '  - {name: eval, key: "${BATCH_EVAL_KEY}"}'
OTHER_MODELS: Final = "models: [fast]"
UNKNOWN: Final = "batch_0123456789abcdef0123456789abcdef"
ENDED: Final = ("completed", "failed", "expired", "cancelled")


@pytest.fixture
def gw(tmp_path: Path, url: str) -> Iterator[GatewayThread]:
    """`eval` a YAML key of team blue, `other` a YAML key of no team; each team with its admin. At most two
    lines in flight, so a batch of `slower` (400 ms) lines runs for seconds."""
    text = config(url, concurrency=2, more=TEAMS)
    assert EVAL_LINE in text and OTHER_MODELS in text
    text = text.replace(EVAL_LINE, EVAL_LINE[:-1] + ", team: blue}").replace(OTHER_MODELS, "models: [fast, slower]")
    path = tmp_path / "config.yaml"
    path.write_text(text)
    with GatewayThread(path, TEAM_ENV) as running:
        yield running


def call(gw: GatewayThread, key: str | None, method: str, path: str, **kwargs: Any) -> httpx.Response:
    with client(gw.url, key) as c:
        return c.request(method, path, **kwargs)


def slow_batch(gw: GatewayThread, key: str, lines: int = 40) -> str:
    """A batch of `lines` lines of the 400 ms model, made by the client key `key`: its id."""
    data = jsonl([line(f"s-{i}", model="slower", prompt=f"p {i}") for i in range(lines)])
    with client(gw.url, key) as c:
        uploaded = c.post("/v1/files", data={"purpose": "batch"}, files={"file": ("in.jsonl", data)})
        assert uploaded.status_code == 200, uploaded.text
        spec = {"input_file_id": uploaded.json()["id"], "endpoint": "/v1/completions", "completion_window": "24h"}
        made = c.post("/v1/batches", json=spec)
        assert made.status_code == 200, made.text
        return str(made.json()["id"])


def admin_batch(gw: GatewayThread, admin: str, batch_id: str) -> dict[str, Any]:
    resp = call(gw, admin, "GET", f"/admin/batches/{batch_id}")
    assert resp.status_code == 200, resp.text
    return dict(resp.json())


def wait_for(gw: GatewayThread, batch_id: str, done: Callable[[dict[str, Any]], bool], timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while not done(batch := admin_batch(gw, ADMIN_KEY, batch_id)):
        assert time.monotonic() < deadline, (batch["status"], batch["request_counts"], batch["errors"])
        time.sleep(0.05)
    return batch


def results(gw: GatewayThread, key: str, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    resp = call(gw, key, "GET", f"/v1/files/{file_id}/content")
    assert resp.status_code == 200, resp.text
    return [json.loads(x) for x in resp.text.splitlines()]


def test_the_operator_reads_and_cancels_another_keys_batch(gw: GatewayThread) -> None:
    batch_id = slow_batch(gw, OTHER_KEY)
    running = wait_for(gw, batch_id, lambda b: b["status"] == "in_progress" and b["request_counts"]["completed"] >= 1)
    assert (running["id"], running["owner"]) == (batch_id, "other")
    listed = call(gw, ADMIN_KEY, "GET", "/admin/batches").json()["data"]
    assert running["owner_id"] == listed[0]["owner_id"] and listed[0]["id"] == batch_id

    asked = call(gw, ADMIN_KEY, "POST", f"/admin/batches/{batch_id}/cancel")
    assert asked.status_code == 200, asked.text
    assert asked.json()["status"] in ("cancelling", "cancelled") and asked.json()["cancelling_at"] is not None
    assert (asked.json()["owner"], asked.json()["owner_id"]) == ("other", running["owner_id"])
    ended = wait_for(gw, batch_id, lambda b: b["status"] in ENDED)
    assert ended["status"] == "cancelled" and ended["cancelled_at"] is not None

    # The object the listing shows, and the key's own view of it with its owner.
    own = call(gw, OTHER_KEY, "GET", f"/v1/batches/{batch_id}").json()
    assert ended == call(gw, ADMIN_KEY, "GET", "/admin/batches").json()["data"][0]
    assert ended == {**own, "owner": "other", "owner_id": running["owner_id"]}
    # Cancelled as the key's own cancel does: every line once, those not run closed `batch_cancelled`.
    out = results(gw, OTHER_KEY, own["output_file_id"])
    err = results(gw, OTHER_KEY, own["error_file_id"])
    assert sorted(x["custom_id"] for x in out + err) == sorted(f"s-{i}" for i in range(40))
    assert 1 <= len(out) < 40 and {e["error"]["code"] for e in err} == {"batch_cancelled"}

    # A batch that has ended: cancelling it again changes nothing and answers it as it is, on either route.
    again = call(gw, ADMIN_KEY, "POST", f"/admin/batches/{batch_id}/cancel")
    assert again.status_code == 200 and again.json() == ended, again.text
    theirs = call(gw, OTHER_KEY, "POST", f"/v1/batches/{batch_id}/cancel")
    assert theirs.status_code == 200 and theirs.json() == own, theirs.text


def test_a_team_admin_reaches_its_teams_keys_batches_only(gw: GatewayThread) -> None:
    b1 = call(gw, BLUE_ADMIN, "POST", "/admin/keys", json={"name": "b1"}).json()
    g1 = call(gw, ADMIN_KEY, "POST", "/admin/keys", json={"name": "g1", "team": "green"}).json()
    mine = {slow_batch(gw, EVAL_KEY): "eval", slow_batch(gw, b1["secret"]): "b1"}  # blue: YAML, runtime
    green = slow_batch(gw, g1["secret"])
    solo = slow_batch(gw, OTHER_KEY)  # a key of no team

    for batch_id, owner in mine.items():
        seen = admin_batch(gw, BLUE_ADMIN, batch_id)
        assert (seen["id"], seen["owner"]) == (batch_id, owner)
        assert seen.keys() == admin_batch(gw, ADMIN_KEY, batch_id).keys()  # the operator's shape
    assert admin_batch(gw, GREEN_ADMIN, green)["owner"] == "g1"

    # Another team's batch, a no-team key's and an unknown id: one 404, worded alike but for the id.
    def refused(admin: str, method: str, path: str, batch_id: str) -> str:
        resp = call(gw, admin, method, path.format(batch_id))
        assert resp.status_code == 404, (admin, path, batch_id, resp.text)
        assert resp.json()["error"]["code"] == "not_found", resp.text
        return resp.text.replace(batch_id, "<id>")

    for method, path in (("GET", "/admin/batches/{}"), ("POST", "/admin/batches/{}/cancel")):
        unknown = refused(BLUE_ADMIN, method, path, UNKNOWN)
        for foreign in (green, solo):
            assert refused(BLUE_ADMIN, method, path, foreign) == unknown
        for theirs in (*mine, solo):
            assert refused(GREEN_ADMIN, method, path, theirs) == unknown
    for batch_id in (green, solo):  # asked to cancel by the wrong admin: untouched
        assert admin_batch(gw, ADMIN_KEY, batch_id)["cancelling_at"] is None

    # Its team's batches it cancels, a revoked key's too: what the key made stays the team's.
    first, second = mine
    assert call(gw, BLUE_ADMIN, "DELETE", f"/admin/keys/{b1['key']['id']}").status_code == 200
    mine[second] = b1["key"]["id"]  # a key no longer in force is named by its identity, as in the list
    for batch_id in (first, second):
        asked = call(gw, BLUE_ADMIN, "POST", f"/admin/batches/{batch_id}/cancel")
        assert asked.status_code == 200, asked.text
        assert asked.json()["status"] in ("cancelling", "cancelled") and asked.json()["owner"] == mine[batch_id]
        assert wait_for(gw, batch_id, lambda b: b["status"] in ENDED)["status"] == "cancelled"
        assert admin_batch(gw, BLUE_ADMIN, batch_id)["status"] == "cancelled"

    # A client key is no admin key, and no key is none.
    for key in (EVAL_KEY, None, "not-a-key"):
        assert call(gw, key, "GET", f"/admin/batches/{first}").status_code == 401
        assert call(gw, key, "POST", f"/admin/batches/{green}/cancel").status_code == 401
    for batch_id in (green, solo):
        assert call(gw, ADMIN_KEY, "POST", f"/admin/batches/{batch_id}/cancel").status_code == 200


def test_without_a_ledger_the_answer_is_the_listings(tmp_path: Path) -> None:
    text = re.sub(r"ledger: \{[^\n]*\n", "", config("sqlite:///unused.db", more=TEAMS))
    text = re.sub(r"batches: \{[^\n]*\n", "", text)
    assert "ledger" not in text
    path = tmp_path / "config.yaml"
    path.write_text(text)
    with GatewayThread(path, TEAM_ENV) as gw:
        for admin in (ADMIN_KEY, BLUE_ADMIN):
            listing = call(gw, admin, "GET", "/admin/batches")
            assert listing.status_code == 404 and listing.json()["error"]["code"] == "batches_need_ledger"
            for method, path_ in (("GET", f"/admin/batches/{UNKNOWN}"), ("POST", f"/admin/batches/{UNKNOWN}/cancel")):
                resp = call(gw, admin, method, path_)
                assert (resp.status_code, resp.text) == (404, listing.text), (method, path_)
        assert call(gw, None, "GET", f"/admin/batches/{UNKNOWN}").status_code == 401
