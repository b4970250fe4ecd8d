"""The ledger's database restarting mid-batch (PostgreSQL stopped and started again) pauses the batch: the
lines in flight are answered and booked once the database is back, none is sent to the upstream again, and
the batch goes on without waiting for its lease to run out."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path

from aiohttp import web

from tests.helpers.postgres import PostgresServer
from tests.helpers.servers import GatewayChild, cli_env
from tests.helpers.upstreams import Received, Upstream

from .conftest import ENV, EVAL_KEY, config, jsonl, line, results, sdk, upload, wait_batch

LINES = 8
CONCURRENCY = 4


class _Slow(Upstream):
    """Answers each line 1.5 s after it came: long enough for the database to go and come back meanwhile."""

    def __init__(self) -> None:
        super().__init__()
        self.handler = self._answer

    async def _answer(self, request: web.Request, received: Received) -> web.StreamResponse:
        await asyncio.sleep(1.5)
        choice = {"index": 0, "text": "ok", "finish_reason": "stop", "logprobs": None}
        usage = {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
        return web.json_response(
            {"id": "c", "object": "text_completion", "created": 1, "choices": [choice], "usage": usage}
        )


def test_a_database_restart_mid_batch_sends_no_line_twice(tmp_path: Path, pg: PostgresServer) -> None:
    with _Slow() as up:
        path = tmp_path / "config.yaml"
        more = f'  local: {{kind: vllm, base_url: "{up.url}/v1", discover: false}}'
        path.write_text(config(pg.url, lease_ms=5000, concurrency=CONCURRENCY, more=more))
        gw = GatewayChild(path, env=cli_env(**ENV))
        try:
            gw.wait_ready()
            client = sdk(gw.url, EVAL_KEY)
            lines = [line(f"d-{i}", model="local/m", prompt=f"prompt {i}") for i in range(LINES)]
            made = client.batches.create(
                input_file_id=upload(client, jsonl(lines)), endpoint="/v1/completions", completion_window="24h"
            )
            deadline = time.monotonic() + 30
            while len(up.received) < CONCURRENCY:
                assert time.monotonic() < deadline, len(up.received)
                time.sleep(0.02)
            pg.stop()  # the first lines are in flight: their answers come while the database is away
            time.sleep(1.0)
            pg.start()
            batch = wait_batch(client, made.id)
            out = results(client, batch.output_file_id)
        finally:
            gw.stop()
    assert batch.status == "completed", batch.errors
    assert [o["custom_id"] for o in out] == [x["custom_id"] for x in lines]
    sent = Counter(r.json()["prompt"] for r in up.received)
    assert sent == Counter({f"prompt {i}": 1 for i in range(LINES)}), sent
