"""Batches are run fairly between keys: one key's long batches filling every slot a process has hand one
back when another key's batch waits, and each batch still ends whole, every line answered once."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

from .conftest import OTHER_KEY, line, results, sdk, served, start, wait_batch

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
