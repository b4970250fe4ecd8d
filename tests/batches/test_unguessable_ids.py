"""File and batch ids are the only handle on a key's objects that travels: a key that sees its own ids must
learn nothing from them about another key's (no shared prefix, no counter to step through)."""

from __future__ import annotations

import re
from pathlib import Path

from .conftest import OTHER_KEY, jsonl, line, sdk, served, upload


def test_file_and_batch_ids_do_not_give_away_their_neighbours(tmp_path: Path) -> None:
    with served(tmp_path) as (gw, client):
        other = sdk(gw.url, OTHER_KEY)
        mine = [upload(client, jsonl([line("a")])) for _ in range(3)]
        theirs = upload(other, jsonl([line("b", model="fast")]))
        batches = [
            client.batches.create(input_file_id=f, endpoint="/v1/completions", completion_window="24h").id
            for f in mine[:2]
        ]
        # A completion's id is shown to every caller: it must not be a neighbour's prefix either.
        cmpl = client.completions.create(model="fast", prompt="hi", max_tokens=1).id
    ids = [*mine, theirs]
    suffixes = [i.removeprefix("file-") for i in ids] + [b.removeprefix("batch_") for b in batches]
    assert all(re.fullmatch(r"[0-9a-f]{32}", s) for s in suffixes), suffixes
    # No two share a leading half (a process prefix) with each other or with the completion's id.
    halves = {s[:16] for s in suffixes}
    assert len(halves) == len(suffixes), suffixes
    assert not any(h in cmpl for h in halves), (cmpl, suffixes)
