"""A cancel that reaches a batch as its runner moves it from `validating` to `in_progress` cancels it: the
runner's move commits while the cancel's transaction is open (it read `validating`), and the cancel must not
answer 200 with the batch running on, its lines sent to the end.

Two `Store`s of the gateway's own on one real database stand for the runner and the cancelling request; the
runner's transaction is held open a moment after its move, as one is while the cancel's statement reaches the
batch."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Final

from gateway.batches import cancelling, leases, store
from gateway.batches.lines import Line
from gateway.ledger.engine import Cursor, Database

RUNNER: Final = "host-a:boot-a:1:100:aaaa"
OPEN_S: Final = 0.8  # the runner's transaction stays open this long (under the stores' 2 s lock wait)


async def test_a_cancel_racing_the_runners_move_to_in_progress_cancels(url: str) -> None:
    db = Database(url)
    db.migrate()
    db.close()
    runner, api = (store.Store(url, 2000, lambda: 30_000) for _ in range(2))
    try:
        batch_id = await runner.run(store.add_batch, "owner", "file-x", "/v1/completions", "24h", 86_400.0, None, 100)
        assert await runner.run(leases.claim, RUNNER, 30.0, [], {}) == batch_id
        lines = [Line(f"c{i}", b'{"model": "m", "prompt": "p"}') for i in range(3)]
        assert await runner.run(store.store_lines, batch_id, RUNNER, 30.0, lines, 0) == 0

        moved = threading.Event()

        def move_then_commit(cur: Cursor) -> None:
            store.lines_stored(cur, batch_id, RUNNER, 30.0, len(lines), 0, "m")
            moved.set()
            time.sleep(OPEN_S)

        moving = asyncio.ensure_future(runner.run(move_then_commit))
        assert await asyncio.to_thread(moved.wait, 10)
        answered = await api.run(cancelling.cancel, batch_id, "owner")
        await moving
        found, taken, _ = await runner.run(store.take, batch_id, RUNNER, 30.0, 3, 1 << 20)
    finally:
        await runner.close()
        await api.close()
    assert answered is not None and answered[5] == "cancelling", answered
    assert found[0] == "cancelling" and taken == []  # the runner sends none of its lines, and ends it
