"""A batch belongs to its key's identity, not its name: a YAML key given a runtime key's name while that key's
batch runs neither sees the batch nor has its lines run as itself; the key that made it reads it again once
it is back in force. A key that expires mid-batch has the lines left refused, as its own requests are."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Final

import httpx
import openai
import pytest

from tests.helpers.servers import GatewayThread
from tests.helpers.sqlite import opened
from tests.helpers.waiting import wait_until

from .conftest import ADMIN_KEY, ENV, config, line, results, sdk, start, wait_batch

YAML_TWIN: Final = "gk-batches-yaml-twin-9b1f"
LINES = 24


def test_a_batch_never_runs_as_another_key_of_its_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in ENV.items():  # a reload reads the process's environment
        monkeypatch.setenv(name, value)
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    path = tmp_path / "config.yaml"
    plain = config(url, concurrency=2)
    path.write_text(plain)
    lines = [line(f"i-{i}", model="slower", prompt=f"p {i}") for i in range(LINES)]  # 400 ms each, two at once
    with GatewayThread(path, ENV) as gw:
        with httpx.Client(base_url=gw.url, headers={"authorization": f"Bearer {ADMIN_KEY}"}) as adm:
            made = adm.post("/admin/keys", json={"name": "twin"}).json()
            key_id = made["key"]["id"]
            twin = sdk(gw.url, made["secret"])
            batch_id = start(twin, lines)
            wait_batch(twin, batch_id, lambda b: b.request_counts is not None and b.request_counts.completed >= 1)
            # A YAML key takes the runtime key's name (allowed `fast` only: a line run as it would be a 403).
            # The config's key wins the name: the runtime key is out of force, and so is its batch's owner.
            added = f'keys:\n  - {{name: twin, key: "{YAML_TWIN}", models: [fast]}}\n'
            path.write_text(plain.replace("keys:\n", added))
            wait_until(lambda: "twin" in [k.name for k in gw.pipeline.loaded.config.keys], timeout=10)
            other = sdk(gw.url, YAML_TWIN)
            with pytest.raises(openai.NotFoundError):
                other.batches.retrieve(batch_id)
            assert list(other.batches.list()) == []

            # Out of force, the runtime key is shown by its identity; its name is the YAML key's now (once the
            # listing has read the reloaded key list: on a loaded machine that is not the same instant).
            def owners() -> list[tuple[str, str, str]]:
                return [(b["id"], b["owner"], b["owner_id"]) for b in adm.get("/admin/batches").json()["data"]]

            wait_until(lambda: owners() == [(batch_id, key_id, key_id)], timeout=10)
            wait_until(lambda: adm.get("/admin/batches").json()["data"][0]["status"] == "completed", timeout=30)
            # The YAML key runs its own batches, as itself.
            mine = wait_batch(other, start(other, [line(f"o-{i}") for i in range(3)]))
            yaml_id = adm.get("/admin/batches").json()["data"][0]["owner_id"]
            # The config lets go of the name: the runtime key is in force again, and reads its batch's end.
            path.write_text(plain)
            wait_until(lambda: "twin" not in [k.name for k in gw.pipeline.loaded.config.keys], timeout=10)
            wait_until(lambda: adm.get("/admin/batches").json()["data"][1]["owner"] == "twin", timeout=10)
            batch = twin.batches.retrieve(batch_id)
            out, err = results(twin, batch.output_file_id), results(twin, batch.error_file_id)
    assert batch.status == "completed"
    assert 1 <= len(out) < LINES and len(out) + len(err) == LINES
    assert sorted(o["custom_id"] for o in out + err) == sorted(x["custom_id"] for x in lines)
    # Every line left was refused as its own key's: none was sent as the other key (no model_not_allowed).
    assert {e["response"]["body"]["error"]["code"] for e in err} == {"invalid_api_key"}
    assert mine.status == "completed" and mine.request_counts is not None and mine.request_counts.completed == 3
    assert yaml_id.startswith("cfg_")
    with opened(tmp_path / "ledger.db") as conn:
        booked = conn.execute("SELECT batch_id, key_id, count(*) FROM requests GROUP BY batch_id, key_id")
        assert sorted(booked.fetchall()) == sorted([(mine.id, yaml_id, 3), (batch_id, key_id, len(out))])


def test_the_lines_left_of_a_batch_whose_key_expired_are_refused_as_its_requests_are(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(config(f"sqlite:///{tmp_path / 'ledger.db'}", concurrency=1))
    lines = [line(f"x-{i}", model="slower", prompt=f"p {i}") for i in range(12)]  # 400 ms each, one at a time
    with GatewayThread(path, ENV) as gw:
        with httpx.Client(base_url=gw.url, headers={"authorization": f"Bearer {ADMIN_KEY}"}) as adm:
            made = adm.post("/admin/keys", json={"name": "brief", "expires_in_s": 3}).json()
            brief = sdk(gw.url, made["secret"])
            batch_id = start(brief, lines)
            wait_until(lambda: adm.get("/admin/batches").json()["data"][0]["status"] == "completed", timeout=30)
            with pytest.raises(openai.AuthenticationError):  # the key's own requests: refused too
                brief.completions.create(model="fast", prompt="hello", max_tokens=1)
    with opened(tmp_path / "ledger.db") as conn:
        done = dict(conn.execute("SELECT custom_id, result FROM batch_lines WHERE batch_id = ?", (batch_id,)))
        booked = conn.execute(
            "SELECT count(*), min(status), max(status) FROM requests WHERE batch_id = ?", (batch_id,)
        ).fetchone()
    parsed = {cid: json.loads(result) for cid, result in done.items()}
    answered = [c for c, r in parsed.items() if r["response"]["status_code"] == 200]
    refused = [r["response"] for r in parsed.values() if r["response"]["status_code"] != 200]
    assert sorted(parsed) == sorted(x["custom_id"] for x in lines)
    assert 1 <= len(answered) < len(lines) and len(answered) + len(refused) == len(lines)
    assert {(r["status_code"], r["body"]["error"]["code"]) for r in refused} == {(401, "invalid_api_key")}
    assert all("expired" in r["body"]["error"]["message"] for r in refused)
    assert booked == (len(answered), 200, 200)  # no refused line reached the request path
