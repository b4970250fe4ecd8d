"""Lines that come while every replica of their provider is draining (503 `replicas_draining`, a fleet's rolling
restart) are lines the gateway had no room for: no upstream was called, so they are put back and sent again once
a replica is back, not written to the error file."""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from tests.fleet.conftest import answering
from tests.helpers.servers import GatewayThread
from tests.helpers.upstreams import Upstream

from .conftest import ADMIN_KEY, ENV, EVAL_KEY, config, line, results, sdk, start, wait_batch

LINES = 4
ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}


def _requeued(text: str) -> dict[str, float]:
    prefix = "gateway_batch_lines_requeued_total{code="
    return {x.split('"')[1]: float(x.rsplit(" ", 1)[1]) for x in text.splitlines() if x.startswith(prefix)}


def test_lines_meeting_a_draining_fleet_wait_for_a_replica(tmp_path: Path) -> None:
    with Upstream() as up:
        up.handler = answering()
        path = tmp_path / "config.yaml"
        more = f'  engine: {{kind: vllm, discover: false, models: [m], replicas: ["{up.url}/v1"]}}'
        path.write_text(config(f"sqlite:///{tmp_path / 'ledger.db'}", concurrency=2, more=more))
        lines = [line(f"d-{i}", model="engine/m", prompt=f"p {i}") for i in range(LINES)]
        with GatewayThread(path, ENV) as gw, httpx.Client(base_url=gw.url, trust_env=False, timeout=10) as c:
            drained = c.post("/admin/providers/engine/replicas/0/drain", headers=ADMIN)
            assert drained.status_code == 200, drained.text
            client = sdk(gw.url, EVAL_KEY)
            batch_id = start(client, lines)
            deadline = time.monotonic() + 10
            while not _requeued(c.get("/metrics").text).get("replicas_draining") and time.monotonic() < deadline:
                time.sleep(0.1)
            assert _requeued(c.get("/metrics").text).get("replicas_draining"), "no line met the draining fleet"
            assert len(up.received) == 0
            assert c.post("/admin/providers/engine/replicas/0/undrain", headers=ADMIN).is_success
            batch = wait_batch(client, batch_id)
            out = results(client, batch.output_file_id)
            err = results(client, batch.error_file_id)
    assert [e["response"]["body"]["error"]["code"] for e in err] == []
    assert batch.status == "completed" and sorted(o["custom_id"] for o in out) == [x["custom_id"] for x in lines]
