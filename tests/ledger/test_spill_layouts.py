"""A spill file left by an older gateway is replayed whole: rows of every earlier layout (22 values; 23 with
the key's identity; 23 with the batch's id; 24 with both) beside current ones (25, with the endpoint), on both
engines, each in its columns; every row of an older layout was a completion."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from gateway.config import LedgerConfig
from gateway.ledger.batch import NCOLUMNS
from gateway.ledger.book import Ledger
from gateway.limits.usage import day_of

from .conftest import query

TS = 1_795_800_000.0
DAY = day_of(TS)


def _full(rid: str, cache: str | None = None) -> list[object]:
    """The 22 values every layout starts with: `batch.COLUMNS` up to `completion`."""
    head = [rid, f"req-{rid}", TS, DAY, "alice", "blue", "fast", "demo/long", "demo", "openai", 0, 200, None]
    return [*head, 12.0, 3.0, 3, 7, 10, cache, 1, None, None]


@pytest.mark.parametrize("engine", ["sqlite", "postgresql"])
def test_spilled_rows_of_every_layout_are_replayed(engine: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}" if engine == "sqlite" else request.getfixturevalue("pg").url
    spill = tmp_path / "spill"
    spill.mkdir()
    batches = [
        [_full("v22")],  # before rows named their key's identity or their batch
        [[*_full("v23-key", "hit"), "key_0123456789abcdef"]],  # with the key's identity
        [[*_full("v23-batch"), "batch_abc"], [*_full("v23-none"), None]],  # with the batch's id (or none)
        [[*_full("v24"), "cfg_0011223344556677", "batch_def"]],  # with both
        [[*_full("v25"), "cfg_0011223344556677", None, "chat"]],  # this gateway's own
    ]
    assert len(batches[-1][0]) == NCOLUMNS
    # A dead process's file: nobody holds its lock, so the first writer turn replays it.
    (spill / "ledger-spill-1-dead.jsonl").write_text("".join(json.dumps(b) + "\n" for b in batches))

    async def run() -> None:
        ledger = Ledger(LedgerConfig(url=url, spill_dir=str(spill)))
        await ledger.start()
        await ledger.flush()
        await ledger.close()

    asyncio.run(run())
    assert not list(spill.glob("ledger-spill-*"))
    rows = query(url, "SELECT id, key_id, batch_id, cache, endpoint FROM requests ORDER BY id")
    assert rows == [
        ("v22", "", None, None, "completions"),
        ("v23-batch", "", "batch_abc", None, "completions"),
        ("v23-key", "key_0123456789abcdef", None, "hit", "completions"),
        ("v23-none", "", None, None, "completions"),
        ("v24", "cfg_0011223344556677", "batch_def", None, "completions"),
        ("v25", "cfg_0011223344556677", None, None, "chat"),
    ]
    rolled = query(url, "SELECT key_id, requests, prompt_tokens, cached FROM daily ORDER BY key_id")
    assert rolled == [("", 3, 9, 0), ("cfg_0011223344556677", 2, 6, 0), ("key_0123456789abcdef", 1, 3, 1)]
