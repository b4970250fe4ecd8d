"""A key's caps on its uploads hold when it uploads on two replicas at the same moment (PostgreSQL; SQLite
lets one writer in at a time): its stored bytes (`batches.max_key_bytes`) and its files (`batches.max_files`).
Each replica counts its own upload and the other's, stored a moment before or after, never neither."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest

from tests.helpers.postgres import PostgresServer
from tests.helpers.servers import GatewayThread

from .conftest import ENV, EVAL_KEY, config, jsonl, line, sdk, upload, written

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
