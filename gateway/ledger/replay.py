"""Booking rows that may be booked already: spilled batches replayed, a batch split around a refused row, a
Batch API line committed with its answer.

Every row carries an id of its own: the ids a batch's days already hold are looked up first, and only the
rows not booked yet are inserted and added to their rollups, so a replay interrupted and done again books
nothing twice.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Final

from gateway.ledger.batch import (
    INSERT,
    INSERT_SQLITE,
    NCOLUMNS,
    ROLLUP,
    Fold,
    Rollups,
    Row,
    rollup_values,
    row_rollups,
    same,
)
from gateway.ledger.engine import Cursor, Database

_IN_CHUNK: Final = 500
_COMPLETIONS: Final = "completions"  # the endpoint of every row spilled before rows recorded theirs


def commit(cur: Cursor, rows: Sequence[Row], db: Database, fold: Fold = same) -> int:
    """Insert the rows (in the order of `batch.COLUMNS`: replayed from a spill file) not booked yet and add
    exactly those to their rollups (models and targets as `fold` names them); how many were new. Rows
    spilled by an older gateway are replayed as such (`current`)."""
    rows = [r if len(r) == NCOLUMNS else current(r) for r in rows]
    by_day: dict[str, list[str]] = {}
    for r in rows:
        by_day.setdefault(r[3], []).append(r[0])
    db.ensure_days(cur, by_day)
    known: set[str] = set()
    for day, ids in by_day.items():
        for i in range(0, len(ids), _IN_CHUNK):
            chunk = ids[i : i + _IN_CHUNK]
            marks = ", ".join("?" * len(chunk))
            sql = f"SELECT id FROM requests WHERE day = ? AND id IN ({marks})"
            known.update(r[0] for r in cur.rows(sql, [day, *chunk]))
    fresh = [r for r in rows if r[0] not in known] if known else rows
    if not fresh:
        return 0
    cur.executemany(INSERT if db.postgres else INSERT_SQLITE, fresh)
    cur.executemany(ROLLUP, rollup_values(row_rollups(fresh, fold=fold)))
    return len(fresh)


def current(row: Row) -> Row:
    """A spilled row of an older layout in the order of `COLUMNS`: 22 values (before rows named their key's
    identity or their batch) book an empty `key_id` and no batch; 23 values end with either the `key_id` or
    the `batch_id`, told apart by their values: a batch id is None or `batch_...`, a key id never is; 24
    values end with both. Every row of an older layout was a completion (chat came with `endpoint`)."""
    if len(row) == NCOLUMNS - 3:
        return (*row, "", None, _COMPLETIONS)
    if len(row) == NCOLUMNS - 1:
        return (*row, _COMPLETIONS)
    last = row[-1]
    if last is None or (isinstance(last, str) and last.startswith("batch_")):
        return (*row[:-1], "", last, _COMPLETIONS)
    return (*row, None, _COMPLETIONS)


def added(sums: Rollups, part: Rollups, sign: int) -> Rollups:
    """`sums` with `part` added (`sign` 1) or taken away (-1), as a new mapping; a rollup left with no row goes."""
    out = {k: list(v) for k, v in sums.items()}
    for k, v in part.items():
        s = out.setdefault(k, [0] * len(v))
        for i, n in enumerate(v):
            s[i] += sign * n
        if not any(s):
            del out[k]
    return out


def spilled_rollups(batches: Iterable[list[list[Any]]], fold: Fold = same) -> Rollups:
    """The rollups of spilled batches (of any layout), models and targets as `fold` names them."""
    sums: Rollups = {}
    for batch in batches:
        row_rollups([tuple(r) if len(r) == NCOLUMNS else current(tuple(r)) for r in batch], sums, fold)
    return sums
