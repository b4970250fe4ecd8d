"""A batch waiting for a runner (every slot of every process taken by other batches) is cancelled at once:
its cancel does not wait hours for a slot to free, and its lines end `batch_cancelled` in its error file."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Final

from gateway.batches import cancelling, leases, store
from gateway.batches.lines import Line
from gateway.ledger.engine import Database

from .conftest import line, results, served, start

RUNNER: Final = "host-a:boot-a:1:100:aaaa"

RUNNING = 4  # a process runs this many batches at once


def test_a_batch_waiting_for_a_slot_is_cancelled_at_once(tmp_path: Path) -> None:
    with served(tmp_path, concurrency=4) as (_, client):
        busy = [start(client, [line(f"b{b}-{i}", model="slower") for i in range(40)]) for b in range(RUNNING)]
        deadline = time.monotonic() + 15
        while not all(client.batches.retrieve(b).status == "in_progress" for b in busy):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        waiting = start(client, [line("w-0"), line("w-1")])
        time.sleep(0.5)  # a few polls: no slot for it
        assert client.batches.retrieve(waiting).status == "validating"
        client.batches.cancel(waiting)
        deadline = time.monotonic() + 2
        while (batch := client.batches.retrieve(waiting)).status != "cancelled":
            assert time.monotonic() < deadline, batch.status
            time.sleep(0.05)
        still = [client.batches.retrieve(b).status for b in busy]
        err = results(client, batch.error_file_id)
        for b in busy:
            client.batches.cancel(b)
    assert still == ["in_progress"] * RUNNING  # it did not wait for a slot
    assert batch.output_file_id is None and batch.cancelled_at is not None
    assert (
        batch.request_counts is not None and batch.request_counts.completed == 0 and err == []
    )  # never checked: no lines, as OpenAI's


async def test_an_in_progress_batch_no_runner_holds_is_cancelled_at_once(tmp_path: Path) -> None:
    """A batch handed back mid-run (a runner stopped, or yielded its slot) with no runner free to take it."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    schema = Database(url)
    schema.migrate()
    schema.close()
    db = store.Store(url, 5000)
    try:
        batch_id = await db.run(store.add_batch, "owner", "file-x", "/v1/completions", "24h", 86_400.0, None, 100)
        assert await db.run(leases.claim, RUNNER, 30.0, [], {}) == batch_id
        lines = [Line(f"c-{i}", b'{"model": "fast", "prompt": "p"}') for i in range(3)]
        await store.validated(db, batch_id, RUNNER, 30.0, lines, [])
        _, taken, _ = await db.run(store.take, batch_id, RUNNER, 30.0, 1, 1 << 20)
        assert len(taken) == 1  # one line in flight when the runner went
        await db.run(leases.release, batch_id, RUNNER)
        row = await db.run(cancelling.cancel, batch_id, "owner")
        assert row is not None
        assert row[5] == "cancelled", row[5]
        failed, error_file = row[20], row[22]
        data = await db.run(store.result_chunk, batch_id, "err", -1, 100, 1 << 20)
    finally:
        await db.close()
    assert failed == 3 and error_file is not None
    assert [json.loads(text)["error"]["code"] for _, text in data] == ["batch_cancelled"] * 3
