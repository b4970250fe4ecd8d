"""A writer's turn of rows, built and inserted with as little work per row as the engines allow.

The rows a gateway answers in one `flush_ms` mostly repeat the same day, key, team, model, target,
provider, dialect, status and so on: a `Batch` holds each distinct combination once (an entry) and
groups the rows under it, each row keeping only what is its own (its ids, times, tokens and cost).

SQLite: an entry's rows go in statements of up to 50 rows that bind the entry's values once for all of
them, so a row binds eight values (ten with its prompt or completion) instead of twenty-five, and
SQLite's virtual machine starts once per 50 rows, not per row; every entry shares the same few statement
texts, so nothing is prepared per entry. PostgreSQL: the whole batch is one binary `COPY`, whose rows the
server takes without parsing anything (an `INSERT ... SELECT` from JSON arrays cost the server about
five times as much per row: each column's value was read back out of the row's text).
"""

from __future__ import annotations

import collections
import functools
import itertools
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final

from gateway.ledger.engine import Cursor, Database
from gateway.limits.usage import ANONYMOUS, day_of
from gateway.ops.metrics import Record

Row = tuple[Any, ...]
# A waiting row (`pending`): the entry's values but the day (and the row's width), and the row's own values.
Pending = tuple[tuple[Any, ...], tuple[Any, ...]]
# An entry: day, key_name, team, model, target, provider, dialect, stream, status, error, cache, attempts, key_id,
# batch_id (the Batch API's batch the request is a line of, or None), endpoint.
Entry = tuple[Any, ...]
# A rollup's key: day, key_name, team, model, target, key_id; its sums: requests, errors, prompt_tokens,
# completion_tokens, cost_pico, cached.
Rollups = dict[tuple[str, str, str, str, str, str], list[int]]
# A model or target as the rollups book it: the config's name for it (gateway/ops/metrics.py `ModelLabels.fold`),
# so that names a client invents share one rollup instead of each adding rows to `daily` and the usage views.
Fold = Callable[[str], str]
CACHED: Final = frozenset(("hit", "coalesced"))  # the `cache` outcomes that answered from the cache
# The `error` of a row booking an upstream call its request paid for and did not use (a hedge that lost): its
# tokens and cost count in the rollups, and it is no request of its own (`requests` counts the client's).
HEDGE_LOST: Final = "hedge_lost"
# A row's own values in a `Batch`: ten, or eight when it kept neither prompt nor completion (prompt
# logging off, the common case: two fewer values to bind per row).
WIDTH: Final = 10
LEAN: Final = 8

COLUMNS: Final = (
    "id, request_id, ts, day, key_name, team, model, target, provider, dialect, stream, status, error, "
    "latency_ms, ttfb_ms, prompt_tokens, completion_tokens, cost_pico, cache, attempts, prompt, completion, key_id, "
    "batch_id, endpoint"
)
NCOLUMNS: Final = 25
INSERT: Final = (
    f"INSERT INTO requests ({COLUMNS}) VALUES ({', '.join('?' * NCOLUMNS)}) ON CONFLICT (day, id) DO NOTHING"
)
# SQLite: the text columns that may be NULL (error, cache, prompt, completion) come as the integer 0 for
# NULL, which NULLIF turns back into one: SQLite's driver binds a 0 for a tenth of what a None costs it,
# and no text is ever the integer 0. Rows spilled with None give NULL all the same.
_NULLABLE_TEXT: Final = (12, 18, 20, 21)
INSERT_SQLITE: Final = INSERT.replace(
    f"VALUES ({', '.join('?' * NCOLUMNS)})",
    f"VALUES ({', '.join('NULLIF(?, 0)' if i in _NULLABLE_TEXT else '?' for i in range(NCOLUMNS))})",
)
# A rollup's cost stops at the largest 64-bit integer (about $9.2 million a day for one key, model and target)
# rather than overflow: PostgreSQL's BIGINT would refuse every later row of that rollup with its batch, SQLite
# would turn the sum into an inexact float. One request's cost is capped far below (`CALL_COST_MAX`), and the
# token counts an answer may report too, so the other sums never come near it.
COST_SUM_MAX: Final = 2**63 - 1
ROLLUP: Final = (
    "INSERT INTO daily (day, key_name, team, model, target, key_id, requests, errors, prompt_tokens,"
    " completion_tokens, cost_pico, cached) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (day, key_name, key_id, team, model, target) DO UPDATE"
    " SET requests = daily.requests + excluded.requests, errors = daily.errors + excluded.errors,"
    " prompt_tokens = daily.prompt_tokens + excluded.prompt_tokens,"
    " completion_tokens = daily.completion_tokens + excluded.completion_tokens,"
    f" cost_pico = CASE WHEN excluded.cost_pico > {COST_SUM_MAX} - daily.cost_pico THEN {COST_SUM_MAX}"
    " ELSE daily.cost_pico + excluded.cost_pico END, cached = daily.cached + excluded.cached"
)
# SQLite: a statement takes 50, 8 or 1 rows of one entry at once (`_rows_sql`). One statement per row paid,
# per row, a run of SQLite's virtual machine from its start (cursors opened and closed) and a release and
# take of the interpreter's lock (the driver lets go of it around every step).
_ROWS_PER_STATEMENT: Final = (50, 8, 1)
# PostgreSQL: a batch's fresh rows go in as one binary COPY, in the order of `COLUMNS`; a COPY has no
# ON CONFLICT, so a row whose id is already booked fails the batch, which is then booked row by row the
# way a spilled one is (`book.Ledger._book`): looked up first, booked once.
COPY_POSTGRES: Final = f"COPY requests ({COLUMNS}) FROM STDIN (FORMAT BINARY)"
COPY_TYPES: Final = tuple(
    "text text float8 text text text text text text text int4 int4 text float8 float8 int8 int8 int8 text int4"
    " text text text text text".split()
)


class Batch:
    """Rows taken from the queue: `entries[i]` and its rows `groups[i]`, one flat list of `widths[i]`
    values per row (id, request_id, ts, latency_s, upstream_s, prompt_tokens, completion_tokens,
    cost_pico, and with `WIDTH` prompt and completion, where an absent one is `null`: 0 for SQLite, None
    for PostgreSQL). Flat, because SQLite's statements take several rows' values as one sequence."""

    __slots__ = ("entries", "groups", "size", "widths")

    def __init__(self) -> None:
        self.entries: list[Entry] = []
        self.groups: list[list[Any]] = []
        self.widths: list[int] = []
        self.size = 0

    def full(self) -> list[Row]:
        """The rows in the order of `COLUMNS`, as the spill file and `replay.commit` take them."""
        return full_rows(self.entries, self.groups, self.widths)


def _rows(group: list[Any], width: int) -> list[list[Any]]:
    """A group's rows, one list each."""
    return [group[i : i + width] for i in range(0, len(group), width)]


def full_rows(entries: list[Entry], groups: list[list[Any]], widths: list[int]) -> list[Row]:
    """Entries and their groups as rows in the order of `COLUMNS`."""
    out = []
    for entry, group, width in zip(entries, groups, widths, strict=True):
        day, key, team, model, target, provider, dialect, stream, status, error, cache, attempts, key_id, batch, op = (
            entry
        )
        for row in _rows(group, width):
            rid, request_id, ts, latency_s, upstream_s, prompt, completion, cost = row[:LEAN]
            text_in, text_out = row[LEAN:] or (None, None)
            out.append(
                (
                    rid,
                    request_id,
                    ts,
                    day,
                    key,
                    team,
                    model,
                    target,
                    provider,
                    dialect,
                    stream,
                    status,
                    error,
                    latency_s * 1000,
                    upstream_s * 1000 if provider else None,
                    prompt,
                    completion,
                    cost,
                    cache,
                    attempts,
                    text_in if isinstance(text_in, str) else None,
                    text_out if isinstance(text_out, str) else None,
                    key_id,
                    batch,
                    op,
                )
            )
    return out


def pending(rec: Record, elapsed_s: float, ended: float, null: int | None) -> Pending:
    """What the queue holds of an answered request: two tuples, the values its entry is found by (with the
    row's width last) and the row's own, in the order `take` reads them (no slicing there).

    Tuples of strings and numbers only: the collector stops tracking them at its first pass, where a
    `Record` (or a tuple holding one) would be traversed by every collection until the writer took it.
    """
    usage = rec.usage
    text_in, text_out = rec.prompt, rec.completion
    lean = text_in is None and text_out is None
    entry = (
        rec.key or ANONYMOUS,
        rec.model,
        rec.target,
        rec.provider,
        rec.dialect,
        rec.stream,
        rec.status,
        rec.error_code,
        rec.cache_outcome,
        rec.attempts,
        rec.team,  # the key's team and identity as they were when it was answered
        rec.key_id,
        rec.batch_id,
        rec.endpoint,
        LEAN if lean else WIDTH,  # the row's width
    )
    own = (
        rec.request_id,
        ended,
        elapsed_s,
        rec.upstream_s,
        0 if usage is None else usage.prompt_tokens,
        0 if usage is None else usage.completion_tokens,
        rec.cost_pico,  # priced by the usage booking; 0 when nothing served it or the cache answered
    )
    if lean:
        return entry, own
    return entry, (*own, null if text_in is None else text(text_in), null if text_out is None else text(text_out))


def lost_pending(rec: Record, elapsed_s: float, ended: float) -> list[Pending]:
    """What the queue holds of the calls `rec` paid for and did not use (`rec.lost`): a row each, at its own
    target, with status 0 (no answer of its own was sent) and error `HEDGE_LOST`."""
    key = rec.key or ANONYMOUS
    out = []
    for call in rec.lost or ():
        entry = (key, rec.model, call.target, call.provider, rec.dialect, rec.stream, 0, HEDGE_LOST, None, 1)
        who = (rec.team, rec.key_id, rec.batch_id, rec.endpoint, LEAN)
        own = (rec.request_id, ended, elapsed_s, rec.upstream_s, call.prompt_tokens, call.completion_tokens)
        out.append(((*entry, *who), (*own, call.cost_pico)))
    return out


def text(value: str) -> str:
    """A prompt or completion as the ledger stores it: U+0000, which a PostgreSQL text column cannot hold
    (and which would fail the whole batch's insert), becomes U+FFFD on both engines, so both hold the same."""
    return value.replace("\x00", "\ufffd") if "\x00" in value else value


def take(queue: deque[Pending], prefix: str, ids: Iterator[int]) -> Batch:
    """Empty the queue into a `Batch` (on the event loop, where the rows were queued); the rows' ids are
    `prefix` and the next numbers of `ids`, in the queue's order."""
    batch = Batch()
    index: dict[tuple[Any, ...], list[Any]] = {}
    entries, groups, widths = batch.entries, batch.groups, batch.widths
    popleft = queue.popleft
    lo = hi = 0.0
    day = ""
    n = len(queue)
    last: tuple[Any, ...] | None = None
    group: list[Any] = []
    for rid in row_ids(prefix, ids, n):
        values, own = popleft()  # the entry's values and the row's width; the row's own values
        ended = own[1]
        if not lo <= ended < hi:  # the day is formatted once per batch (and at midnight)
            lo = ended // 86400 * 86400
            hi = lo + 86400
            day = day_of(ended)
            index = {}  # entries are per day: a new day starts new ones
            last = None
        # Rows in a row mostly share their entry: equal values are compared, not hashed (the strings decoded
        # from each request are objects of their own, whose hash is computed at its first use).
        if values != last:
            found = index.get(values)
            if found is None:
                found = index[values] = []
                entries.append(
                    (day, values[0], values[10], *values[1:5], int(values[5]), *values[6:10], *values[11:14])
                )
                groups.append(found)
                widths.append(values[14])
            group, last = found, values
        group.append(rid)
        group += own
    batch.size = n
    return batch


_TAILS: Final = tuple(f"{k:03d}" for k in range(1000))


def row_ids(prefix: str, ids: Iterator[int], n: int) -> list[str]:
    """`prefix` and each of the next `n` numbers of `ids` (consecutive, as a count's): `f"{prefix}{i}"`, with
    each thousand's leading digits formatted once and the last three taken from a table (formatting each
    number cost a row about 2,000 instructions, a fifth of its share of the event loop)."""
    if not n:
        return []
    first = next(ids)
    if n > 1:
        collections.deque(itertools.islice(ids, n - 1), maxlen=0)  # drawn, as n calls of next would
    if first < 1000:
        return [f"{prefix}{i}" for i in range(first, first + n)]
    out: list[str] = []
    thousands, k = divmod(first, 1000)
    while n:
        m = min(1000 - k, n)
        out += map(f"{prefix}{thousands}".__add__, _TAILS[k : k + m])
        n -= m
        thousands += 1
        k = 0
    return out


@functools.cache  # at most twelve texts: (50, 8 or 1 rows) x (width) x (whether an upstream served)
def _rows_sql(rows: int, width: int, upstream: bool) -> str:
    """A statement for `rows` rows of one entry: the k-th row's own values are the parameters ?(width * k + 1)
    to ?(width * k + width), the entry's fifteen the ones after all rows', shared by every row (SQLite lets a
    numbered parameter appear more than once)."""
    shared = [f"?{width * rows + i}" for i in range(1, 16)]
    day, key, team, model, target, provider, dialect, stream, status, error, cache, attempts, key_id, batch, op = shared
    tuples = []
    for k in range(rows):
        a = [f"?{width * k + i}" for i in range(1, width + 1)]
        ttfb = f"{a[4]} * 1000" if upstream else "NULL"
        texts = f"NULLIF({a[8]}, 0), NULLIF({a[9]}, 0)" if width == WIDTH else "NULL, NULL"
        tuples.append(
            f"({a[0]}, {a[1]}, {a[2]}, {day}, {key}, {team}, {model}, {target}, {provider}, {dialect}, {stream},"
            f" {status}, {error}, {a[3]} * 1000, {ttfb}, {a[5]}, {a[6]}, {a[7]}, {cache}, {attempts}, {texts},"
            f" {key_id}, {batch}, {op})"
        )
    return f"INSERT INTO requests ({COLUMNS}) VALUES {', '.join(tuples)} ON CONFLICT (day, id) DO NOTHING"


def same(name: str) -> str:
    """A `Fold` that keeps every name (where no config is at hand to bucket them by)."""
    return name


def commit_batch(cur: Cursor, batch: Batch, db: Database, fold: Fold = same) -> int:
    """Insert a batch straight from the queue (its ids are new: no look-up) and add it to its rollups."""
    if not batch.size:
        return 0
    entries, groups, widths = batch.entries, batch.groups, batch.widths
    if db.postgres:
        db.ensure_days(cur, {e[0] for e in entries})
        cur.copy(COPY_POSTGRES, COPY_TYPES, batch.full())
    else:
        # Every entry's rows in statements of 50, then 8, then 1, each statement's parameters its rows' own
        # values then the entry's; one `executemany` per statement text for the whole batch.
        runs: dict[str, list[list[Any]]] = {}
        for entry, group, w in zip(entries, groups, widths, strict=True):
            shared = list(entry)
            n = len(group) // w
            upstream = bool(entry[5])
            start = 0
            for rows in _ROWS_PER_STATEMENT:
                end = start + (n - start) // rows * rows
                if end > start:
                    size = w * rows
                    run = runs.setdefault(_rows_sql(rows, w, upstream), [])
                    run.extend(group[i : i + size] + shared for i in range(start * w, end * w, size))
                start = end
        for sql, params in runs.items():
            cur.executemany(sql, params)
    cur.executemany(ROLLUP, rollup_values(rollups(batch, fold=fold)))
    return batch.size


def rollup_values(sums: Rollups) -> list[tuple[Any, ...]]:
    """`ROLLUP`'s parameters for `sums`, each cost at most `COST_SUM_MAX` (one batch of capped requests may
    sum past it)."""
    return [(*k, *v[:4], min(v[4], COST_SUM_MAX), v[5]) for k, v in sums.items()]


def rollups(batch: Batch, into: Rollups | None = None, fold: Fold = same) -> Rollups:
    """The batch's sums per rollup (what it adds to `daily`), added to `into` when given; the rollup's model
    and target are `fold`'s (a row keeps the model as asked for)."""
    sums: Rollups = {} if into is None else into
    for entry, group, w in zip(batch.entries, batch.groups, batch.widths, strict=True):
        n = len(group) // w
        target = entry[4] and fold(entry[4])  # '' (nothing was called) stays ''
        s = sums.setdefault((entry[0], entry[1], entry[2], fold(entry[3]), target, entry[12]), [0, 0, 0, 0, 0, 0])
        s[0] += n if entry[9] != HEDGE_LOST else 0
        s[1] += n if entry[8] >= 400 else 0
        s[2] += sum(group[5::w])
        s[3] += sum(group[6::w])
        s[4] += sum(group[7::w])
        s[5] += n if entry[10] in CACHED else 0
    return sums


def row_rollups(rows: Sequence[Row], into: Rollups | None = None, fold: Fold = same) -> Rollups:
    """Rows' sums per rollup (in the order of `COLUMNS`), added to `into` when given; models and targets as
    `fold` names them."""
    sums: Rollups = {} if into is None else into
    for r in rows:
        s = sums.setdefault((r[3], r[4], r[5], fold(r[6]), r[7] and fold(r[7]), r[22]), [0, 0, 0, 0, 0, 0])
        s[0] += r[12] != HEDGE_LOST
        s[1] += r[11] >= 400
        s[2] += r[15]
        s[3] += r[16]
        s[4] += r[17]
        s[5] += r[18] in CACHED
    return sums
