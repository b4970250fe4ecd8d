"""The Batch API as the unmodified `openai` SDK calls it, over a real socket, booking into a real SQLite file."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.helpers.servers import GatewayThread

from .conftest import ENV, EVAL_KEY, config, jsonl, line, results, sdk, upload, wait_batch


def test_a_batch_completes_every_line_once_with_the_direct_answer(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(config(f"sqlite:///{tmp_path / 'ledger.db'}"))
    lines = [line(f"q-{i}", prompt=f"question {i} about foxes") for i in range(300)]
    with GatewayThread(path, ENV) as gw:
        client = sdk(gw.url, EVAL_KEY)
        file_id = upload(client, jsonl(lines))
        made = client.batches.create(
            input_file_id=file_id, endpoint="/v1/completions", completion_window="24h", metadata={"suite": "mmlu"}
        )
        assert made.status == "validating" and made.metadata == {"suite": "mmlu"}
        batch = wait_batch(client, made.id)
        assert batch.status == "completed", batch
        assert batch.request_counts is not None
        assert (batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed) == (300, 300, 0)
        assert batch.error_file_id is None and batch.output_file_id is not None
        out = results(client, batch.output_file_id)
        assert [o["custom_id"] for o in out] == [f"q-{i}" for i in range(300)]
        with httpx.Client(base_url=gw.url, headers={"authorization": f"Bearer {EVAL_KEY}"}) as c:
            for o in out[::37]:
                i = int(o["custom_id"][2:])
                direct = c.post("/v1/completions", json=lines[i]["body"]).json()
                got = o["response"]["body"]
                assert o["response"]["status_code"] == 200 and o["error"] is None
                assert got["choices"] == direct["choices"] and got["usage"] == direct["usage"]
        assert client.files.retrieve(batch.output_file_id).bytes == len(client.files.content(batch.output_file_id).content)
        assert made.id in [b.id for b in client.batches.list()]
