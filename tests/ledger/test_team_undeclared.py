"""A runtime key whose team the config in force does not declare fails closed: refused, not freed of its team.

Over real sockets, on a real SQLite ledger file: runtime keys of team `red` work; a reload whose `teams:` no
longer declares `red` refuses them at once with the 403 `team_undeclared` in each dialect's error shape, on
the completion and chat routes, the model-scoped base path, `/tokenize`, `GET /v1/models` and the Batch API,
and the lines left of a batch one of them made fail with it in the batch's error file; keys of declared teams
and of none go on as before, and the operator still lists the keys. A reload declaring `red` again lets the keys
in at once, and `red`'s admin sees them again.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import httpx
import pytest

from tests.helpers.clients import body, client
from tests.helpers.errors import ALL_ROUTES, assert_error
from tests.helpers.servers import GatewayThread, rewrite
from tests.helpers.waiting import wait_until

from .conftest import ADMIN_KEY, ENV, SOLO_KEY, TEAM_KEY, config

RED_ADMIN: Final = "adm-team-closed-red-8e2d"
TEAMS: Final = 'teams: {blue: {}, green: {}, red: {}, "-red": {}}'
WITH_RED: Final = f"teams: {{blue: {{}}, green: {{}}, red: {{admin_key: '{RED_ADMIN}'}}, '-red': {{}}}}"
WITHOUT_RED: Final = "teams: {blue: {}, green: {}, '-red': {}}"
CHAT_ROUTES: Final = {
    "/v1/chat/completions": "/v1/completions",
    "/inference/v1/chat/completions": "/inference/v1/completions",
    "/v4/beta/chat/completions": "/v4/beta/completions",
    "/api/v1/compatibility/openai/v1/chat/completions": "/api/v1/compatibility/openai/v1/completions",
}


def served(tmp_path: Path) -> tuple[Path, str]:
    """The ledger suite's config declaring `red` (with an admin), a slow model and one batch line at a time,
    its secrets written in (a reload reads the process environment, which the suite does not set)."""
    text = config(f"sqlite:///{tmp_path / 'ledger.db'}")
    assert TEAMS in text
    text = text.replace(TEAMS, WITH_RED).replace("models: [long, text]", "models: [long, text, slow-400ms]")
    text += "batches: {poll_ms: 100, concurrency: 1}\n"
    for var, secret in ENV.items():
        text = text.replace("${" + var + "}", secret)
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path, text


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[tuple[GatewayThread, Path, str]]:
    path, text = served(tmp_path)
    with GatewayThread(path, ENV, poll_every=0.1) as gw:
        yield gw, path, text


def reload(gw: GatewayThread, path: Path, text: str) -> None:
    assert text != path.read_text()
    before = gw.app.state.reloader.reloads
    rewrite(path, text)
    wait_until(lambda: gw.app.state.reloader.reloads > before, timeout=10)


def make(gw: GatewayThread, **spec: Any) -> tuple[str, str]:
    """A runtime key made by the operator: (its secret, its id)."""
    with client(gw.url, ADMIN_KEY) as c:
        made = c.post("/admin/keys", json=spec)
    assert made.status_code == 201, made.text
    return made.json()["secret"], made.json()["key"]["id"]


def listed(gw: GatewayThread, admin: str) -> list[str]:
    with client(gw.url, admin) as c:
        resp = c.get("/admin/keys")
    assert resp.status_code == 200, resp.text
    return sorted(k["name"] for k in resp.json()["keys"])


def chat(model: str = "fast") -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 3}


def calls(gw: GatewayThread, key: str) -> dict[str, httpx.Response]:
    """One request of every kind a client key makes, each answer by a name for it."""
    out: dict[str, httpx.Response] = {}
    with client(gw.url, key) as c:
        for route in ALL_ROUTES:
            out[route] = c.post(route, json=body(model="fast"))
        for route in CHAT_ROUTES:
            out[route] = c.post(route, json=chat())
        out["scoped"] = c.post("/m/fast/v1/completions", json={"prompt": "hi", "max_tokens": 3})
        out["scoped models"] = c.get("/m/fast/v1/models")
        out["tokenize"] = c.post("/tokenize", json={"model": "demo/text", "prompt": "hi"})
        out["models"] = c.get("/v1/models")
        out["files"] = c.get("/v1/files")
        out["batches"] = c.get("/v1/batches")
    return out


def works(gw: GatewayThread, key: str) -> None:
    """Every request of `calls` let in: answered, and `/tokenize` past the key to the fake provider, which
    has no tokenizer."""
    answers = calls(gw, key)
    assert {what: r.status_code for what, r in answers.items()} == {**dict.fromkeys(answers, 200), "tokenize": 404}
    assert answers["tokenize"].json()["error"]["code"] == "tokenizer_not_available"


def refused(answers: dict[str, httpx.Response], name: str) -> None:
    """Every answer the 403 `team_undeclared`, in its route's dialect, naming the key and its own team alone."""
    message = (
        f"Key '{name}' is of team 'red', which the gateway's config does not declare: "
        "the key is refused until its team is declared again"
    )
    for what, resp in answers.items():
        route = CHAT_ROUTES.get(what, what if what in ALL_ROUTES else "/v1/completions")
        assert_error(resp, route, status=403, type="permission_error", code="team_undeclared", message=message)


def test_a_key_of_a_team_no_longer_declared_is_refused_until_it_is_declared_again(
    gateway: tuple[GatewayThread, Path, str],
) -> None:
    gw, path, text = gateway
    red, _ = make(gw, name="r1", team="red")
    blue, _ = make(gw, name="b1", team="blue")
    nobody, _ = make(gw, name="n1")
    with client(gw.url, RED_ADMIN) as c:
        by_admin = c.post("/admin/keys", json={"name": "r2"})
    assert by_admin.status_code == 201, by_admin.text
    for key in (red, by_admin.json()["secret"]):
        works(gw, key)

    reload(gw, path, text.replace(WITH_RED, WITHOUT_RED))
    # At once, on every client route: no wait for the key poll.
    refused(calls(gw, red), "r1")
    refused(calls(gw, by_admin.json()["secret"]), "r2")
    with client(gw.url, red) as c:
        made = c.post("/v1/batches", json={"input_file_id": "file-x", "endpoint": "/v1/completions"})
    refused({"/v1/completions": made}, "r1")
    # A wrong key is told only that it is wrong; the keys of declared teams, and of none, go on.
    with client(gw.url, "rk-not-a-key") as c:
        assert c.post("/v1/completions", json=body(model="fast")).json()["error"]["code"] == "invalid_api_key"
    for key in (blue, nobody, TEAM_KEY, SOLO_KEY):
        works(gw, key)
    # The operator still sees the refused keys, to revoke them; `red`'s admin is gone with its team.
    assert listed(gw, ADMIN_KEY) == ["b1", "n1", "r1", "r2"]
    with client(gw.url, RED_ADMIN) as c:
        assert c.get("/admin/keys").status_code == 401

    reload(gw, path, text)
    for key in (red, by_admin.json()["secret"]):
        works(gw, key)
    assert listed(gw, RED_ADMIN) == ["r1", "r2"]


def test_the_lines_left_of_a_batch_are_refused_while_its_keys_team_is_undeclared(
    gateway: tuple[GatewayThread, Path, str],
) -> None:
    gw, path, text = gateway
    red, _ = make(gw, name="r1", team="red")
    lines = [
        {
            "custom_id": f"x-{i}",
            "method": "POST",
            "url": "/v1/completions",
            "body": {"model": "demo/slow-400ms", "prompt": f"p {i}", "max_tokens": 3},
        }
        for i in range(12)
    ]  # 400 ms each, one at a time
    data = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
    with client(gw.url, red) as c:
        uploaded = c.post("/v1/files", data={"purpose": "batch"}, files={"file": ("in.jsonl", data)})
        assert uploaded.status_code == 200, uploaded.text
        spec = {"input_file_id": uploaded.json()["id"], "endpoint": "/v1/completions", "completion_window": "24h"}
        made = c.post("/v1/batches", json=spec)
        assert made.status_code == 200, made.text
        batch_id = made.json()["id"]

        def done() -> int:
            counts = c.get(f"/v1/batches/{batch_id}").json()["request_counts"]
            return int(counts["completed"]) if counts else 0

        wait_until(lambda: done() >= 1, timeout=30)
    reload(gw, path, text.replace(WITH_RED, WITHOUT_RED))
    with client(gw.url, ADMIN_KEY) as adm:

        def status() -> str:
            return str(adm.get(f"/admin/batches/{batch_id}").json()["status"])

        wait_until(lambda: status() == "completed", timeout=30)
        assert adm.get(f"/admin/batches/{batch_id}").json()["owner"] == "red/r1"  # named, though refused
    reload(gw, path, text)
    with client(gw.url, red) as c:  # its team declared again: the key reads its batch's files
        found = c.get(f"/v1/batches/{batch_id}").json()
        answers: dict[str, dict[str, Any]] = {}
        for file_id in (found["output_file_id"], found["error_file_id"]):
            if file_id is not None:
                for row in c.get(f"/v1/files/{file_id}/content").text.splitlines():
                    answer = json.loads(row)
                    answers[answer["custom_id"]] = answer["response"]
        assert c.post("/v1/completions", json=body(model="fast")).status_code == 200
    assert answers.keys() == {f"x-{i}" for i in range(12)}
    ok = [a for a in answers.values() if a["status_code"] == 200]
    no = [a for a in answers.values() if a["status_code"] != 200]
    assert 1 <= len(ok) < len(lines), answers
    assert {(a["status_code"], a["body"]["error"]["code"], a["body"]["error"]["type"]) for a in no} == {
        (403, "team_undeclared", "permission_error")
    }
    assert all("Key 'r1' is of team 'red'" in a["body"]["error"]["message"] for a in no)
