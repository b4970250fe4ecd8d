"""Two teams' runtime keys of one name, as each view names them: the operator's tell them apart, a team's
admin reads its own by name.

Over real sockets, on a real SQLite ledger file: `blue`'s and `green`'s admins each make a key `ci`, which
make a completion, a `/tokenize` call and a slow batch. The access log's `key` (every line, a batch's lines
too), the cost metric's `key`, `/admin/batches` (the list and one batch) and the status page's running batches
show the operator `blue/ci` and `green/ci`; each team's admin sees its own `ci`; a YAML key and a key of no
team are shown by their name. Each `ci` lists its own team's models on `GET /v1/models`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import pytest

from tests.helpers.accesslog import Lines, listening
from tests.helpers.clients import body, client, slow_batch
from tests.helpers.servers import GatewayThread
from tests.helpers.waiting import wait_until

ADMIN: Final = "adm-kl-op-6d21"
BLUE_ADMIN: Final = "adm-kl-blue-0e94"
GREEN_ADMIN: Final = "adm-kl-green-b37c"
ALICE: Final = "gk-kl-alice-5a08"
SOLO: Final = "gk-kl-solo-c1f2"
ENV: Final = {"KL_ADMIN": ADMIN, "KL_BLUE": BLUE_ADMIN, "KL_GREEN": GREEN_ADMIN, "KL_ALICE": ALICE, "KL_SOLO": SOLO}

CONFIG: Final = """
admin: {{key: "${{KL_ADMIN}}"}}
logging: {{requests: true}}
retries: {{attempts: 1}}
ledger: {{url: "{url}", flush_ms: 100, keys_poll_ms: 200}}
batches: {{poll_ms: 100, concurrency: 2}}
keys:
  - {{name: alice, key: "${{KL_ALICE}}", team: blue}}
  - {{name: solo, key: "${{KL_SOLO}}"}}
teams:
  blue: {{admin_key: "${{KL_BLUE}}", models: [fast, slower]}}
  green: {{admin_key: "${{KL_GREEN}}", models: [other]}}
prices:
  demo/long: {{prompt_per_1m: 1000, completion_per_1m: 2000}}
  far/slow-400ms: {{prompt_per_1m: 1000, completion_per_1m: 2000}}
providers:
  demo: {{kind: fake, models: [long, slow-400ms]}}
  far: {{kind: fake, models: [slow-400ms]}}
models:
  - {{name: fast, targets: [{{model: demo/long}}]}}
  - {{name: slower, targets: [{{model: demo/slow-400ms}}]}}
  - {{name: other, targets: [{{model: far/slow-400ms}}]}}
"""


@pytest.fixture
def gw(tmp_path: Path) -> Iterator[GatewayThread]:
    path = tmp_path / "config.yaml"
    path.write_text(CONFIG.format(url=f"sqlite:///{tmp_path / 'ledger.db'}"))
    with GatewayThread(path, ENV) as g:
        yield g


def get(gw: GatewayThread, key: str, path: str) -> Any:
    with client(gw.url, key) as c:
        resp = c.get(path)
    assert resp.status_code == 200, (path, resp.text)
    return resp.json()


def made(gw: GatewayThread, admin: str, name: str) -> str:
    with client(gw.url, admin) as c:
        resp = c.post("/admin/keys", json={"name": name})
    assert resp.status_code == 201, resp.text
    return str(resp.json()["secret"])


def batch(gw: GatewayThread, key: str, model: str) -> str:
    """A batch of 20 slow lines by `key` (several seconds): its id."""
    return slow_batch(gw.url, key, model)


def keys_logged(access: Lines, **where: Any) -> list[str | None]:
    """The access log's `key` of each line whose fields hold `where`, in the order written."""
    return [line["key"] for line in list(access.lines) if all(line.get(k) == v for k, v in where.items())]


def cost_keys(gw: GatewayThread) -> set[str]:
    with client(gw.url) as c:
        text = c.get("/metrics").text
    return set(re.findall(r'^gateway_cost_usd_total\{[^}]*key="([^"]*)"', text, re.MULTILINE))


def test_the_operator_tells_two_teams_keys_of_one_name_apart(gw: GatewayThread) -> None:
    blue, green = made(gw, BLUE_ADMIN, "ci"), made(gw, GREEN_ADMIN, "ci")
    with listening() as access:
        for secret, model in ((blue, "fast"), (green, "other"), (ALICE, "fast"), (SOLO, "fast")):
            with client(gw.url, secret) as c:
                assert c.post("/v1/completions", json=body(model=model)).status_code == 200
                # The fake provider has no tokenizer: a 404 after the key was let in, logged under it all the same.
                tokenized = c.post("/tokenize", json={"model": model, "prompt": "hi"})
                assert tokenized.json()["error"]["code"] == "tokenizer_not_available", tokenized.text
        wait_until(lambda: len(keys_logged(access, endpoint="completions")) == 4, timeout=10)
        # A team's runtime key is `team/name`; a YAML key (even of a team) and a key of no team, its name.
        assert keys_logged(access, endpoint="completions") == ["blue/ci", "green/ci", "alice", "solo"]
        assert keys_logged(access, endpoint="tokenize") == ["blue/ci", "green/ci", "alice", "solo"]
        assert {"blue/ci", "green/ci", "alice", "solo"} <= cost_keys(gw)

        mine, theirs = batch(gw, blue, "slower"), batch(gw, green, "other")
        # Running: the status page's batches, the operator's and each team admin's.
        owners = {b["id"]: b["owner"] for b in get(gw, ADMIN, "/admin/status")["batches"]}
        assert owners == {mine: "blue/ci", theirs: "green/ci"}
        for admin, own in ((BLUE_ADMIN, mine), (GREEN_ADMIN, theirs)):
            assert [(b["id"], b["owner"]) for b in get(gw, admin, "/admin/status")["batches"]] == [(own, "ci")]

        listed = {b["id"]: b["owner"] for b in get(gw, ADMIN, "/admin/batches")["data"]}
        assert listed == {mine: "blue/ci", theirs: "green/ci"}
        assert get(gw, ADMIN, f"/admin/batches/{theirs}")["owner"] == "green/ci"
        for admin, own in ((BLUE_ADMIN, mine), (GREEN_ADMIN, theirs)):
            assert [(b["id"], b["owner"]) for b in get(gw, admin, "/admin/batches")["data"]] == [(own, "ci")]
            assert get(gw, admin, f"/admin/batches/{own}")["owner"] == "ci"

        # A batch's lines are logged under the key that made it, told apart the same way.
        wait_until(lambda: keys_logged(access, batch_id=mine) and keys_logged(access, batch_id=theirs), timeout=30)
        assert set(keys_logged(access, batch_id=mine)) == {"blue/ci"}
        assert set(keys_logged(access, batch_id=theirs)) == {"green/ci"}
    with client(gw.url, ADMIN) as c:
        for batch_id in (mine, theirs):
            cancelled = c.post(f"/admin/batches/{batch_id}/cancel")
            assert cancelled.status_code == 200 and cancelled.json()["owner"] in ("blue/ci", "green/ci"), cancelled.text


def test_each_teams_key_of_one_name_lists_its_own_models(gw: GatewayThread) -> None:
    blue, green = made(gw, BLUE_ADMIN, "ci"), made(gw, GREEN_ADMIN, "ci")
    for _ in range(2):  # the second time from the memoized page: still each key's own
        assert [m["id"] for m in get(gw, blue, "/v1/models")["data"]] == ["fast", "slower"]
        assert [m["id"] for m in get(gw, green, "/v1/models")["data"]] == ["other"]
