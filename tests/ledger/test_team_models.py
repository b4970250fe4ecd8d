"""A team's model ceiling (`teams.<name>.models`): every key of the team, YAML or runtime, may call a model only
when its own `models` and its team's both match it.

Over real sockets, on a real SQLite ledger file: team `blue` may call the alias `fast` only. Its YAML key
`alice` (whose own `models` is every model) is refused any other model with the 403 `model_not_allowed` a
key's own patterns give, on the completion and chat routes of every dialect, under the model-scoped base
path, on `/tokenize` and in a batch's lines, and `GET /v1/models` lists it `fast` alone; a key of no team
is not held to it. A runtime key a team admin makes with `models: ["**"]` is held to its team, and a reload
that narrows the team applies to a runtime key made before it at once, without waiting for the key poll.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import httpx
import pytest

from gateway.limits.globs import ModelGlobs
from tests.helpers.clients import body, client
from tests.helpers.errors import ALL_ROUTES, assert_error
from tests.helpers.servers import GatewayThread, rewrite
from tests.helpers.waiting import wait_until

from .conftest import ADMIN_KEY, ENV, SOLO_KEY, TEAM_KEY, config

BLUE_ADMIN: Final = "adm-team-models-blue-3f9a"
TEAMS: Final = 'teams: {blue: {}, green: {}, red: {}, "-red": {}}'
NARROW: Final = "teams: {blue: {admin_key: '${BLUE_ADMIN}', models: [fast]}, green: {}, red: {}, '-red': {}}"
WIDE: Final = "teams: {blue: {admin_key: '${BLUE_ADMIN}'}, green: {}, red: {}, '-red': {}}"
TEAM_ENV: Final = {**ENV, "BLUE_ADMIN": BLUE_ADMIN}
CHAT_ROUTES: Final = {
    "/v1/chat/completions": "/v1/completions",
    "/inference/v1/chat/completions": "/inference/v1/completions",
    "/v4/beta/chat/completions": "/v4/beta/completions",
    "/api/v1/compatibility/openai/v1/chat/completions": "/api/v1/compatibility/openai/v1/completions",
}


def served(tmp_path: Path, teams: str, *, literal: bool = False) -> tuple[Path, str]:
    """The ledger suite's config with `teams`, written out; with `literal`, its secrets written in (a reload
    reads the process environment, which the suite does not set)."""
    text = config(f"sqlite:///{tmp_path / 'ledger.db'}")
    assert TEAMS in text
    text = text.replace(TEAMS, teams)
    if literal:
        for var, secret in TEAM_ENV.items():
            text = text.replace("${" + var + "}", secret)
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path, text


@pytest.fixture
def narrow(tmp_path: Path) -> Iterator[GatewayThread]:
    path, _ = served(tmp_path, NARROW)
    with GatewayThread(path, TEAM_ENV) as gw:
        yield gw


def post(gw: GatewayThread, key: str, path: str, json_body: Any) -> httpx.Response:
    with client(gw.url, key) as c:
        return c.post(path, json=json_body)


def models_of(gw: GatewayThread, key: str, path: str = "/v1/models") -> list[str]:
    with client(gw.url, key) as c:
        resp = c.get(path)
    assert resp.status_code == 200, resp.text
    return [card["id"] for card in resp.json()["data"]]


def refused(resp: httpx.Response, route: str, key: str, model: str) -> None:
    """The 403 a key's own `models` gives, in the route's dialect, saying that the team is why."""
    assert_error(
        resp,
        route,
        status=403,
        type="permission_error",
        param="model",
        code="model_not_allowed",
        message=f"Key '{key}' may not use model '{model}' (team 'blue' may not)",
    )


def chat(model: str) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 3}


def test_a_yaml_key_is_held_to_its_teams_models_everywhere(narrow: GatewayThread) -> None:
    gw = narrow
    for route in ALL_ROUTES:
        assert post(gw, TEAM_KEY, route, body(model="fast")).status_code == 200, route
        # `fast`'s own target too: the ceiling is over the model string the client sends.
        for model in ("demo/text", "demo/long"):
            refused(post(gw, TEAM_KEY, route, body(model=model)), route, "alice", model)
    for route, dialect in CHAT_ROUTES.items():
        assert post(gw, TEAM_KEY, route, chat("fast")).status_code == 200, route
        refused(post(gw, TEAM_KEY, route, chat("demo/text")), dialect, "alice", "demo/text")
    # The model-scoped base path, its listing and the tokenizer routes.
    assert post(gw, TEAM_KEY, "/m/fast/v1/completions", {"prompt": "hi", "max_tokens": 3}).status_code == 200
    scoped = post(gw, TEAM_KEY, "/m/demo/text/v1/completions", {"prompt": "hi", "max_tokens": 3})
    refused(scoped, "/v1/completions", "alice", "demo/text")
    assert post(gw, TEAM_KEY, "/m/demo/text/v1/chat/completions", chat("demo/text")).status_code == 403
    with client(gw.url, TEAM_KEY) as c:
        refused(c.get("/m/demo/text/v1/models"), "/v1/completions", "alice", "demo/text")
    assert models_of(gw, TEAM_KEY, "/m/fast/v1/models") == ["fast"]
    refused(
        post(gw, TEAM_KEY, "/tokenize", {"model": "demo/text", "prompt": "hi"}), "/v1/completions", "alice", "demo/text"
    )
    # What the key may call, and only that, is listed.
    assert models_of(gw, TEAM_KEY) == ["fast"]
    # A key of no team is held to its own `models` alone.
    assert post(gw, SOLO_KEY, "/v1/completions", body(model="demo/text")).status_code == 200
    assert post(gw, SOLO_KEY, "/v1/chat/completions", chat("demo/text")).status_code == 200
    assert {"fast", "demo/long", "demo/text"} <= set(models_of(gw, SOLO_KEY))


def batch(gw: GatewayThread, key: str, models: list[str]) -> dict[str, int]:
    """A batch of one completion line per model, made and waited for as a client would: each line's status."""
    lines = [
        {
            "custom_id": m,
            "method": "POST",
            "url": "/v1/completions",
            "body": {"model": m, "prompt": "x", "max_tokens": 3},
        }
        for m in models
    ]
    data = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
    with client(gw.url, key) as c:
        uploaded = c.post("/v1/files", data={"purpose": "batch"}, files={"file": ("in.jsonl", data)})
        assert uploaded.status_code == 200, uploaded.text
        spec = {"input_file_id": uploaded.json()["id"], "endpoint": "/v1/completions", "completion_window": "24h"}
        made = c.post("/v1/batches", json=spec)
        assert made.status_code == 200, made.text
        deadline = time.monotonic() + 30
        while (found := c.get(f"/v1/batches/{made.json()['id']}").json())["status"] != "completed":
            assert time.monotonic() < deadline, found
            time.sleep(0.1)
        out: dict[str, int] = {}
        for file_id in (found["output_file_id"], found["error_file_id"]):
            if file_id is not None:
                for row in c.get(f"/v1/files/{file_id}/content").text.splitlines():
                    answer = json.loads(row)
                    out[answer["custom_id"]] = answer["response"]["status_code"]
                    if answer["response"]["status_code"] == 403:
                        assert answer["response"]["body"]["error"]["code"] == "model_not_allowed"
        return out


def test_a_batch_runs_its_lines_under_the_teams_models(narrow: GatewayThread) -> None:
    assert batch(narrow, TEAM_KEY, ["fast", "demo/text"]) == {"fast": 200, "demo/text": 403}
    assert batch(narrow, SOLO_KEY, ["fast", "demo/text"]) == {"fast": 200, "demo/text": 200}


def make(gw: GatewayThread, admin: str, **spec: Any) -> Any:
    with client(gw.url, admin) as c:
        return c.post("/admin/keys", json=spec)


def test_a_team_admins_key_for_every_model_is_still_held_to_the_team(narrow: GatewayThread) -> None:
    gw = narrow
    made = make(gw, BLUE_ADMIN, name="b1", models=["**"])
    assert made.status_code == 201, made.text
    secret = made.json()["secret"]
    assert post(gw, secret, "/v1/completions", body(model="fast")).status_code == 200
    refused(post(gw, secret, "/v1/completions", body(model="demo/text")), "/v1/completions", "b1", "demo/text")
    refused(post(gw, secret, "/v1/chat/completions", chat("demo/long")), "/v1/completions", "b1", "demo/long")
    assert models_of(gw, secret) == ["fast"]
    # Patterns that never meet the team's are taken (the intersection applies): such a key calls nothing.
    apart = make(gw, BLUE_ADMIN, name="b2", models=["demo/*"])
    assert apart.status_code == 201, apart.text
    assert apart.json()["key"]["models"] == ["demo/*"]
    for model in ("fast", "demo/text"):
        resp = post(gw, apart.json()["secret"], "/v1/completions", body(model=model))
        assert resp.status_code == 403 and resp.json()["error"]["code"] == "model_not_allowed", resp.text
    assert models_of(gw, apart.json()["secret"]) == []
    # The operator's key for the team is held to it as well; one of no team is not.
    blue = make(gw, ADMIN_KEY, name="o1", team="blue").json()["secret"]
    nobody = make(gw, ADMIN_KEY, name="o2").json()["secret"]
    assert post(gw, blue, "/v1/completions", body(model="demo/text")).status_code == 403
    assert post(gw, nobody, "/v1/completions", body(model="demo/text")).status_code == 200


def test_a_reload_that_narrows_the_team_applies_to_its_runtime_keys_at_once(tmp_path: Path) -> None:
    path, wide = served(tmp_path, WIDE, literal=True)
    with GatewayThread(path, TEAM_ENV, poll_every=0.1) as gw:
        secret = make(gw, BLUE_ADMIN, name="b1", models=["**"]).json()["secret"]
        for key in (secret, TEAM_KEY):
            assert post(gw, key, "/v1/completions", body(model="demo/text")).status_code == 200
        assert "demo/text" in models_of(gw, secret)
        poller = gw.app.state.ledger.poller
        seen = poller.seen
        before = gw.app.state.reloader.reloads
        rewrite(path, wide.replace(f"admin_key: '{BLUE_ADMIN}'", f"admin_key: '{BLUE_ADMIN}', models: [fast]"))
        wait_until(lambda: gw.app.state.reloader.reloads > before, timeout=10)
        # The keys were not read again (no key changed): the config in force alone holds the key to its team.
        assert poller.seen == seen
        refused(post(gw, secret, "/v1/completions", body(model="demo/text")), "/v1/completions", "b1", "demo/text")
        refused(post(gw, TEAM_KEY, "/v1/completions", body(model="demo/text")), "/v1/completions", "alice", "demo/text")
        assert post(gw, secret, "/v1/completions", body(model="fast")).status_code == 200
        assert models_of(gw, secret) == ["fast"]
        # And a reload that widens it again gives the models back.
        before = gw.app.state.reloader.reloads
        rewrite(path, wide)
        wait_until(lambda: gw.app.state.reloader.reloads > before, timeout=10)
        assert post(gw, secret, "/v1/completions", body(model="demo/text")).status_code == 200


def test_a_keys_globs_within_its_teams() -> None:
    own = ModelGlobs(["**"])
    team = ModelGlobs(["fast", "demo/*"])
    bound = own.within(team)
    assert [bound.match(m) for m in ("fast", "demo/text", "demo/text/east", "other/x")] == [True, True, False, False]
    # The key's own globs are untouched (its memo is not the bound one's), and no ceiling is itself.
    assert own.match("other/x") and own.ceiling is None
    assert own.within(None) is own
    narrower = ModelGlobs(["demo/long"]).within(team)
    assert [narrower.match(m) for m in ("fast", "demo/long", "demo/text")] == [False, True, False]
