"""A replica stalled in the middle of one of its batch's transactions (stopped, swapped out, its VM paused)
holds that batch's row locks on PostgreSQL. The server ends its session once it has been idle in the
transaction for `batches.lease_ms`; a session stopped in the middle of a statement, which the server counts
as busy and no timeout of its ends, is ended by the claiming replica once it has waited on its process as
long. Another replica takes the batch over when the lease runs out, instead of when the stalled one wakes;
the stalled one, awake, writes nothing.

Two `Store`s of the gateway's own on one real PostgreSQL stand for the two replicas: the stalled one's
transaction renews its lease and then waits, as a process stopped between two statements (or inside one)
would."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Final

import pytest

from gateway.batches import leases, store
from gateway.ledger.engine import Cursor, Database, LedgerDown
from tests.helpers.postgres import PostgresServer

LEASE_MS: Final = 1000
STALL_S: Final = 6.0
# Holders of two hosts: neither can see the other's processes, so each waits for the other's lease.
STALLED: Final = "host-a:boot-a:1:100:aaaa"
SURVIVOR: Final = "host-b:boot-b:1:100:bbbb"


# Where the holder stops, and how long after it began the survivor takes the batch at most: a session idle
# in its transaction is ended by the server once idle a lease long; one the server's timeouts do not end (inside
# a statement, or idle with no timeout in force) by the claim, once its lease ran out and it waited a lease more.
STALLS: Final = {
    "idle": LEASE_MS / 1000 + 2.5,
    "mid-statement": 2 * LEASE_MS / 1000 + 2.5,
    "idle-untimed": 2 * LEASE_MS / 1000 + 2.5,
}


@pytest.mark.parametrize("where", list(STALLS))
async def test_a_holder_stalled_inside_a_transaction_loses_its_batch(pg: PostgresServer, where: str) -> None:
    """Stopped between two statements (`idle`), the server ends its session. Stopped after sending a pipeline's
    statement but before its Sync (as `executemany` sends them: `mid-statement`), its session is `active`,
    waiting on its client, and no idle or statement timeout of the server ends it; nor one idle in its
    transaction with no idle timeout in force (`idle-untimed`, as a session under load was seen to outlive its
    own). The claim ends those, once they have waited so a lease long."""
    db = Database(pg.url)
    db.migrate()
    db.close()
    stalled, survivor = (store.Store(pg.url, 500, lambda: LEASE_MS) for _ in range(2))
    try:
        batch_id = await stalled.run(store.add_batch, "owner", "file-x", "/v1/completions", "24h", 86_400.0, None, 100)
        assert await stalled.run(leases.claim, STALLED, LEASE_MS / 1000, [], {}) == batch_id

        def stall(cur: Cursor) -> Any:
            held = store.state(cur, batch_id, STALLED, LEASE_MS / 1000)  # the batch's row locked, lease renewed
            if where == "idle-untimed":
                cur.execute("SET LOCAL idle_in_transaction_session_timeout = 0")
            elif where == "mid-statement":
                wire = cur.raw.connection.pgconn
                wire.enter_pipeline_mode()
                wire.send_query_params(b"UPDATE batch_lines SET sends = sends WHERE batch_id = $1", [batch_id.encode()])
                wire.flush()  # the statement sent, its Sync not yet: stopped there
            time.sleep(STALL_S)
            return held

        asleep = asyncio.ensure_future(stalled.run(stall))
        t0 = time.monotonic()
        await asyncio.sleep(0.1)
        while True:
            try:
                if await survivor.run(leases.claim, SURVIVOR, LEASE_MS / 1000, [], {}) == batch_id:
                    break
            except LedgerDown:
                pass  # the row is still locked: the statement's lock_timeout
            assert time.monotonic() - t0 < STALL_S - 1, "the stalled holder's locks held the batch"
            await asyncio.sleep(0.1)
        taken = time.monotonic() - t0
        with pytest.raises(LedgerDown):  # its session was ended: its renewal never committed
            await asyncio.wait_for(asleep, STALL_S + 5)
        with pytest.raises(leases.LostLease):  # awake again, it holds nothing
            await stalled.run(store.state, batch_id, STALLED, LEASE_MS / 1000)
        owner = await survivor.run(lambda cur: cur.rows("SELECT lease_owner FROM batches WHERE id = ?", (batch_id,)))
    finally:
        await stalled.close()
        await survivor.close()
    assert owner == [(SURVIVOR,)]
    assert taken < STALLS[where], taken
