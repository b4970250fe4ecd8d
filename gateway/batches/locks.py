"""The locks that make a key's and a team's caps hold across replicas on PostgreSQL.

A transaction that counts what a key (or a team) holds, to refuse what would pass a cap, takes the key's lock
(then its team's) first and holds them until it ends: two replicas adding for one key at the same moment are
counted one after the other, the second seeing the first's row, so they cannot both pass. SQLite's
BEGIN IMMEDIATE already lets one writer in at a time.
"""

from __future__ import annotations

from typing import Final

from gateway.ledger.engine import Cursor

# PostgreSQL advisory locks' first keys ("batk", "batc"); the second is the key's or the team's name hashed.
# Two names hashed alike only wait for each other, which costs time, not correctness.
_KEY: Final = 0x6261746B
_TEAM: Final = 0x62617463


def hold(cur: Cursor, owner: str, team: str | None = None) -> None:
    """Take the `owner` key's lock, then its `team`'s, for the rest of the transaction. Always in that order,
    so two transactions never each hold a lock the other waits for."""
    if not cur.postgres:
        return
    cur.execute(f"SELECT pg_advisory_xact_lock({_KEY}, hashtext(?))", (owner,))
    if team is not None:
        cur.execute(f"SELECT pg_advisory_xact_lock({_TEAM}, hashtext(?))", (team,))


__all__ = ["hold"]
