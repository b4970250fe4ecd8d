"""A holder whose lease ran out (it stalled, or a step of its outlasted the lease) writes again at the moment
another replica claims the batch: it must find it lost the lease, whichever commits first. Were it let through
once, its `take` would mark lines sent that it then never books (its next write finds the lease lost), and the
new holder, which sends only lines not marked, would wait for them until the batch's window ran out.

Two `Store`s of the gateway's own on one real database stand for the two replicas; the claim's transaction
is held open a moment, as a replica's claim is open while the late holder's statement reaches the batch."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Final

import pytest

from gateway.batches import leases, store
from gateway.batches.lines import Line
from gateway.ledger.engine import Cursor, Database

LATE: Final = "host-a:boot-a:1:100:aaaa"
TAKER: Final = "host-b:boot-b:1:100:bbbb"
OPEN_S: Final = 0.8  # the claim's transaction stays open this long (under the stores' 2 s lock wait)


async def test_a_late_holder_racing_a_takeover_writes_nothing(url: str) -> None:
    db = Database(url)
    db.migrate()
    db.close()
    late, taker = (store.Store(url, 2000, lambda: 30_000) for _ in range(2))
    try:
        batch_id = await late.run(store.add_batch, "owner", "file-x", "/v1/completions", "24h", 86_400.0, None, 100)
        short = 0.001  # the late holder's lease: run out by the time anyone looks
        assert await late.run(leases.claim, LATE, short, [], {}) == batch_id
        lines = [Line(f"c{i}", b'{"model": "m", "prompt": "p"}') for i in range(3)]
        await store.validated(late, batch_id, LATE, short, lines, [])
        await asyncio.sleep(0.01)

        claimed = threading.Event()

        def claim_then_commit(cur: Cursor) -> str | None:
            got = leases.claim(cur, TAKER, 30.0, [], {})
            claimed.set()
            time.sleep(OPEN_S)
            return got

        taking = asyncio.ensure_future(taker.run(claim_then_commit))
        assert await asyncio.to_thread(claimed.wait, 10)
        with pytest.raises(leases.LostLease):
            await late.run(store.take, batch_id, LATE, short, 3, 1 << 20)
        assert await taking == batch_id
        _, taken, _ = await taker.run(store.take, batch_id, TAKER, 30.0, 3, 1 << 20)
        owner = await taker.run(lambda cur: cur.rows("SELECT lease_owner FROM batches WHERE id = ?", (batch_id,)))
    finally:
        await late.close()
        await taker.close()
    assert owner == [(TAKER,)]
    assert [row[1] for row in taken] == ["c0", "c1", "c2"]  # every line is the new holder's to send
