"""Cancelling a batch: its runner stops its lines and ends it `cancelled`; one no runner holds ends at once.

A batch waits for a runner while every process runs its most batches already (another key's, or this key's
older ones), and one handed back mid-run (a runner stopped, or yielded its slot) waits the same way. Left to
a runner, its cancel would wait for a slot to free: hours behind long batches. The request that cancels it
ends it instead, in its own transaction, taking the free lease for that moment so that no runner claims it
meanwhile: its stored lines not answered close as `batch_cancelled`, as a runner closes them.
"""

from __future__ import annotations

import time
from typing import Any, Final

from gateway.batches.objects import unanswered
from gateway.batches.store import EVERY_OWNER, Owners, batch_row, finish, left
from gateway.ids import unique_suffix
from gateway.ledger.engine import Cursor

# The lease holder the cancelling request stands as while it ends the batch (no runner's name: see leases).
_CANCELLER: Final = "cancel"
_MESSAGE: Final = "This request was not executed: the batch was cancelled."
_CANCELLABLE: Final = ("validating", "in_progress")


def cancel(cur: Cursor, batch_id: str, owner: str | None, owners: Owners = EVERY_OWNER) -> tuple[Any, ...] | None:
    """Ask the batch's runner to stop (`cancelling`), or end it `cancelled` now when no runner holds it; the
    batch as it is then, None when `owner` (None: an admin, over the keys `owners` picks) has no such batch."""
    row = batch_row(cur, batch_id, owner, owners)
    if row is None:
        return None
    if row[5] not in _CANCELLABLE:
        return row
    now = time.time()
    # Matched against the status the row has when the update reaches it, not the one read above: a runner's
    # move from `validating` to `in_progress` committed in between (the update waits for it on PostgreSQL)
    # would otherwise match nothing, and the cancel answer 200 with the batch running on.
    asked = cur.execute(
        "UPDATE batches SET status = 'cancelling', cancelling_at = ? WHERE id = ? AND status IN (?, ?)",
        (now, batch_id, *_CANCELLABLE),
    )
    # Compare and set, as a claim does: a runner claiming it now finds the lease taken, or this finds it held.
    # Only a batch this request moved to `cancelling`: one a runner ended meanwhile has a free lease too.
    if asked and cur.execute(
        "UPDATE batches SET lease_owner = ?, lease_until = ? WHERE id = ? AND lease_until < ?",
        (_CANCELLER, now + 60, batch_id, now),
    ):
        if cur.rows("SELECT in_progress_at FROM batches WHERE id = ?", (batch_id,))[0][0] is None:
            # Never `in_progress`: its lines (if a runner stored some before it stopped) were never to run.
            cur.execute("DELETE FROM batch_lines WHERE batch_id = ?", (batch_id,))
        # Lines `sent` had a runner that is gone: their answers were never booked, nor will be.
        closed = [
            (idx, unanswered("batch_req_" + unique_suffix(), cid, "batch_cancelled", _MESSAGE).decode())
            for idx, cid in left(cur, batch_id)
        ]
        finish(cur, batch_id, _CANCELLER, 60, "cancelled", closed)
    return batch_row(cur, batch_id, owner, owners)


__all__ = ["cancel"]
