"""Batches are run fairly between keys: one key's long batches filling every slot a process has hand one
back when another key's batch waits, and each batch still ends whole, every line answered once."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

from .conftest import OTHER_KEY, jsonl, line, results, sdk, served, start, upload, wait_batch

LINES = 12  # each of eval's batches: 400 ms a line, two lines at a time over all of them


def test_a_key_with_every_slot_hands_one_to_another_keys_batch(tmp_path: Path) -> None:
    with served(tmp_path, concurrency=2) as (gw, client):
        mine = [start(client, [line(f"{b}-{i}", model="slower") for i in range(LINES)], window="1h") for b in range(4)]
        time.sleep(0.5)  # all four taken by the runner, lines in flight
        other = sdk(gw.url, OTHER_KEY)
        began = time.monotonic()
        theirs = wait_batch(other, start(other, [line("o-1")], window="30s"), timeout=30)
        waited = time.monotonic() - began
        ended = [wait_batch(client, b, timeout=60) for b in mine]
        answers = [r["custom_id"] for b in ended for r in results(client, b.output_file_id)]
    # Unfairly run, it would wait for one of eval's batches to end: about 6 s at these rates.
    assert theirs.status == "completed" and theirs.request_counts.completed == 1, theirs
    assert waited < 3.5, waited
    # The batch that handed its slot back resumed: every line of every batch answered, none twice.
    assert [b.status for b in ended] == ["completed"] * 4
    assert Counter(answers) == Counter(f"{b}-{i}" for b in range(4) for i in range(LINES))


def test_a_key_behind_many_older_batches_of_another_still_gets_a_slot(tmp_path: Path) -> None:
    # More of eval's batches wait than a claim reads at once (64): the other key's, made after all of them,
    # is still seen waiting, and one of eval's hands its slot over.
    with served(tmp_path, concurrency=1) as (gw, client):
        file_id = upload(client, jsonl([line(f"w-{i}", model="slower") for i in range(3)]))
        window: Any = "1h"  # the SDK's type says 24h; the gateway takes more
        mine = [
            client.batches.create(input_file_id=file_id, endpoint="/v1/completions", completion_window=window).id
            for _ in range(80)
        ]
        other = sdk(gw.url, OTHER_KEY)
        began = time.monotonic()
        theirs = wait_batch(other, start(other, [line("o-1")], window="60s"), timeout=60)
        waited = time.monotonic() - began
        for batch_id in mine:
            client.batches.cancel(batch_id)
    assert theirs.status == "completed" and theirs.request_counts.completed == 1, theirs
    # Unseen behind the 64 oldest, it would wait for 16 of eval's batches to end: about 20 s here.
    assert waited < 6, waited
