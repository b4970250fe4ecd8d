"""Two gateways share a PostgreSQL ledger; the one running a batch stalls (SIGSTOP) and the other takes the batch
over when its lease runs out; the stalled one wakes (SIGCONT) and writes nothing more: every custom_id is
answered exactly once."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import psycopg

from tests.helpers.postgres import PostgresServer
from tests.helpers.servers import GatewayChild, cli_env

from .conftest import ENV, EVAL_KEY, config, jsonl, line, results, sdk, upload, wait_batch


def _runner(url: str, batch_id: str) -> tuple[str | None, int]:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT lease_owner, completed FROM batches WHERE id = %s", (batch_id,)).fetchone()
    assert row is not None
    return row[0], int(row[1])


def test_another_replica_takes_over_a_stalled_ones_batch(tmp_path: Path, pg: PostgresServer) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(config(pg.url, lease_ms=1000, concurrency=4))
    lines = [line(f"p-{i}", model="slow", prompt=f"prompt {i}") for i in range(120)]
    a = GatewayChild(path, env=cli_env(**ENV))
    b = GatewayChild(path, env=cli_env(**ENV))
    try:
        a.wait_ready()
        b.wait_ready()
        client = sdk(a.url, EVAL_KEY)
        made = client.batches.create(
            input_file_id=upload(client, jsonl(lines)), endpoint="/v1/completions", completion_window="24h"
        )
        deadline = time.monotonic() + 30
        while _runner(pg.url, made.id)[1] < 30:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        owner = _runner(pg.url, made.id)[0]
        assert owner is not None
        # Stall whichever replica holds the lease (the pid is part of the owner's name).
        pid = int(owner.split(":")[1])
        survivor = b if pid == a.server_pid else a
        assert pid in (a.server_pid, b.server_pid)
        os.kill(pid, signal.SIGSTOP)
        try:
            while _runner(pg.url, made.id)[0] == owner:
                assert time.monotonic() < deadline + 30
                time.sleep(0.05)
        finally:
            os.kill(pid, signal.SIGCONT)  # it wakes with lines in flight and a lease it no longer holds
        batch = wait_batch(sdk(survivor.url, EVAL_KEY), made.id)
        assert batch.status == "completed"
        out = results(sdk(survivor.url, EVAL_KEY), batch.output_file_id)
        assert batch.error_file_id is None
    finally:
        a.stop()
        b.stop()
    assert [o["custom_id"] for o in out] == [x["custom_id"] for x in lines]
    with psycopg.connect(pg.url, autocommit=True) as conn:
        sends = [r[0] for r in conn.execute("SELECT sends FROM batch_lines WHERE batch_id = %s", (made.id,))]
    assert len(sends) < sum(sends) <= len(sends) + 4 and max(sends) == 2
