"""A key's caps hold when it adds on two replicas at the same moment (PostgreSQL; SQLite lets one writer in at
a time): its stored uploads' bytes (`batches.max_key_bytes`), its files (`batches.max_files`) and its batches
not ended (`batches.max_batches`). Each replica counts its own addition and the other's, made a moment before
or after, never neither."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest

from tests.helpers.postgres import PostgresServer
from tests.helpers.servers import GatewayThread

from .conftest import ENV, EVAL_KEY, config, jsonl, line, sdk, upload, wait_batch, written

ROUNDS = 40
DATA = jsonl([line(f"k-{i}", prompt="x" * 200) for i in range(4)])


def _at_once(clients: list[openai.OpenAI], add: Callable[[openai.OpenAI], str]) -> list[str]:
    """`add` on each client at the same moment: what each made, those not refused with a 409."""
    gate = threading.Barrier(len(clients))

    def send(client: openai.OpenAI) -> str | None:
        gate.wait()
        try:
            return add(client)
        except openai.ConflictError:
            return None

    with ThreadPoolExecutor(len(clients)) as pool:
        return [made for made in pool.map(send, clients) if made is not None]


@pytest.mark.parametrize("cap", [f"max_key_bytes: {len(DATA) * 3 // 2}", "max_files: 1"])
def test_one_key_uploading_on_two_replicas_at_once_never_passes_its_cap(
    tmp_path: Path, pg: PostgresServer, cap: str
) -> None:
    """With room for one upload: one is stored and the other refused each time, never both."""
    path = written(tmp_path, config(pg.url, extra=f", {cap}"))
    with GatewayThread(path, ENV) as one, GatewayThread(path, ENV) as two:
        clients = [sdk(one.url, EVAL_KEY), sdk(two.url, EVAL_KEY)]
        stored: list[list[str]] = []
        for _ in range(ROUNDS):
            stored.append(_at_once(clients, lambda client: upload(client, DATA)))
            for file_id in stored[-1]:
                clients[0].files.delete(file_id)
    assert [len(s) for s in stored] == [1] * ROUNDS


def test_one_key_making_batches_on_two_replicas_at_once_never_passes_max_batches(
    tmp_path: Path, pg: PostgresServer
) -> None:
    """With `batches.max_batches: 1`: one batch is made and the other refused each time, never both."""
    # A line that takes seconds: a batch made stays not ended while the other replica counts, until cancelled.
    text = config(pg.url, extra=", max_batches: 1").replace("slow-400ms]", "slow-400ms, slow-5000ms]")
    text = text.replace("models:\n", "models:\n  - {name: slowest, targets: [{model: demo/slow-5000ms}]}\n", 1)
    path = written(tmp_path, text)
    with GatewayThread(path, ENV) as one, GatewayThread(path, ENV) as two:
        clients = [sdk(one.url, EVAL_KEY), sdk(two.url, EVAL_KEY)]
        file_id = upload(clients[0], jsonl([line("k-0", model="slowest")]))

        def create(client: openai.OpenAI) -> str:
            return client.batches.create(input_file_id=file_id, endpoint="/v1/completions", completion_window="24h").id

        made: list[list[str]] = []
        for _ in range(ROUNDS):
            made.append(_at_once(clients, create))
            for batch_id in made[-1]:  # ended, so the next round has room for one again
                clients[0].batches.cancel(batch_id)
                assert wait_batch(clients[0], batch_id).status == "cancelled"
    assert [len(m) for m in made] == [1] * ROUNDS
