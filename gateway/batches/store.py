"""Files, batches and lines in the ledger's database: every statement the Batch API runs, one transaction each
(a checked file's lines: several, `validated`).

`Store` holds its own connection on its own thread (the routes and the runner wait on it, never the event
loop, and never behind the ledger's writer). A runner holds a batch by its lease (`lease_owner`,
`lease_until`): every write a runner makes checks that it still holds it, so a process that lost its lease
(it stalled, another took the batch over) writes nothing more. A line's answer is written once: only a
line still `sent` takes one, so two runners can never both book the same line.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final, TypeVar

import msgspec

from gateway.batches import locks
from gateway.batches.files import add_result, drop, drop_if_gone, expired
from gateway.batches.leases import held
from gateway.batches.lines import Line, batch_model
from gateway.batches.objects import ACTIVE, ERR, OK, SENT, TERMINAL, TODO, BatchError, Booked, answered
from gateway.ids import unguessable, unique_suffix
from gateway.ledger.batch import Fold, same
from gateway.ledger.engine import Cursor, Database
from gateway.ledger.replay import commit

T = TypeVar("T")
_IN_CHUNK: Final = 500  # lines per INSERT / UPDATE statement batch
STORE_LINES: Final = 2000  # a checked file's lines stored per transaction, at most (`validated`)
STORE_BYTES: Final = 4 * 1024 * 1024  # and bytes of their bodies, at most (or one line, if longer)

BATCH_COLUMNS: Final = (
    "id, owner, endpoint, input_file_id, completion_window, status, metadata, errors, reason, created_at, "
    "expires_at, in_progress_at, finalizing_at, completed_at, failed_at, expired_at, cancelling_at, "
    "cancelled_at, total, completed, failed, output_file_id, error_file_id, input_tokens, cached_tokens, "
    "output_tokens, reasoning_tokens, model"
)


class Store:
    """The Batch API's connection and thread."""

    def __init__(self, url: str, timeout_ms: int, lease_ms: Callable[[], int] | None = None) -> None:
        self.db = Database(url, timeout_ms)
        # PostgreSQL: a session of this store idle inside a transaction this long (`batches.lease_ms`, as a
        # reload sets it) is ended by the server. A process stalled mid-transaction (stopped, swapped out, a
        # VM paused) would otherwise keep the row locks of its batch, and no replica could take it over when
        # its lease runs out; no transaction of this store waits on its client that long while alive.
        self.lease_ms = lease_ms
        # How long a view that must answer anyway (the status page) waits: the database's own bound, which a
        # server that stopped answering altogether (no statement timeout fires) never reaches, and a margin.
        self.wait_s = timeout_ms / 1000 + 1.0
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="batches")

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(cur, *args)` in one transaction on the store's thread."""
        loop = asyncio.get_running_loop()
        idle_ms = self.lease_ms() if self.lease_ms is not None and self.db.postgres else 0

        def body(cur: Cursor) -> T:
            if idle_ms:
                cur.execute(f"SET LOCAL idle_in_transaction_session_timeout = {int(idle_ms)}")
            return fn(cur, *args)

        out: T = await loop.run_in_executor(self._pool, self.db.transaction, body)
        return out

    async def close(self) -> None:
        await asyncio.get_running_loop().run_in_executor(self._pool, self.db.close)
        self._pool.shutdown(wait=False, cancel_futures=True)


# ---------------------------------------------------------------------------------------------- reads


def _octets(cur: Cursor, column: str) -> str:
    """SQL for the size in UTF-8 bytes of a text column's value, in the cursor's dialect."""
    return f"octet_length({column})" if cur.postgres else f"length(CAST({column} AS BLOB))"


def result_chunk(
    cur: Cursor, batch_id: str, state: str, after: int, limit: int, max_bytes: int
) -> list[tuple[int, str]]:
    """A result file's lines after line `after` (by position in the input file): at most `limit`, and at most
    `max_bytes` of them (or the one line, if longer)."""
    where = "batch_id = ? AND state = ? AND idx > ?"
    sizes = cur.rows(
        f"SELECT idx, {_octets(cur, 'result')} FROM batch_lines WHERE {where} ORDER BY idx LIMIT ?",
        (batch_id, state, after, limit),
    )
    if not sizes:
        return []
    last, total = sizes[0][0], 0
    for idx, size in sizes:
        total += int(size or 0)
        if total > max_bytes and idx != sizes[0][0]:
            break
        last = idx
    rows = cur.rows(
        f"SELECT idx, result FROM batch_lines WHERE {where} AND idx <= ? ORDER BY idx",
        (batch_id, state, after, last),
    )
    return [(int(r[0]), str(r[1])) for r in rows]


Owners = tuple[str, Sequence[Any]]  # a condition on the `owner` column, and its arguments
EVERY_OWNER: Final[Owners] = ("", ())


def team_owners(team: str, yaml_idents: Sequence[str]) -> Owners:
    """The condition that picks the objects of one team's keys: its runtime keys (their team in `api_keys`,
    revoked ones too: what they made stays the team's) and its YAML keys in force (`yaml_idents`, their
    identities; the config alone knows their team)."""
    marks = ", ".join("?" * len(yaml_idents))
    yaml = f" OR owner IN ({marks})" if yaml_idents else ""
    return f"(owner IN (SELECT id FROM api_keys WHERE team = ?){yaml})", (team, *yaml_idents)


def page(
    cur: Cursor,
    table: str,
    columns: str,
    owner: str | None,
    after: str | None,
    limit: int,
    extra: tuple[str, Sequence[Any]] = ("", ()),
    oldest_first: bool = False,
    owners: Owners = EVERY_OWNER,
) -> list[tuple[Any, ...]]:
    """Newest first (or oldest), `limit + 1` rows (the caller says `has_more`), those after the object `after`;
    `owner`'s alone, or (None) those `owners` picks (a team's keys'), or every key's."""
    mine: list[str] = []
    mine_params: list[Any] = []
    if owner is not None:
        mine.append("owner = ?")
        mine_params.append(owner)
    if owners[0]:
        mine.append(owners[0])
        mine_params.extend(owners[1])
    where, params = ["1 = 1", *mine], list(mine_params)
    if extra[0]:
        where.append(extra[0])
        params.extend(extra[1])
    if after and "\x00" not in after:  # with one: no object's id, a cursor that does not exist
        # Another tenant's (or team's) id is a cursor that does not exist: its time must not shape this page.
        narrowed = "".join(f" AND {c}" for c in mine)
        mark = cur.rows(f"SELECT created_at FROM {table} WHERE id = ?{narrowed}", (after, *mine_params))
        if mark:
            beyond = ">" if oldest_first else "<"
            where.append(f"(created_at {beyond} ? OR (created_at = ? AND id {beyond} ?))")
            params += [mark[0][0], mark[0][0], after]
    order = "ASC" if oldest_first else "DESC"
    sql = f"SELECT {columns} FROM {table} WHERE {' AND '.join(where)} ORDER BY created_at {order}, id {order} LIMIT ?"
    return cur.rows(sql, [*params, limit + 1])


# ---------------------------------------------------------------------------------------------- batches


class TooManyBatches(Exception):
    """The key has `batches.max_batches` batches not ended already."""


def add_batch(
    cur: Cursor,
    owner: str,
    input_file_id: str,
    endpoint: str,
    window: str,
    window_s: float,
    metadata: dict[str, str] | None,
    max_batches: int,
    output_expires_s: int | None = None,
) -> str:
    locks.hold(cur, owner)  # counted one after another on every replica: two at once cannot both pass the cap
    marks = ", ".join("?" * len(ACTIVE))
    running = cur.rows(f"SELECT count(*) FROM batches WHERE owner = ? AND status IN ({marks})", (owner, *ACTIVE))
    if running[0][0] >= max_batches:
        raise TooManyBatches(
            f"this key has {running[0][0]} batches not ended, the most batches.max_batches allows: wait for one, "
            "or cancel one"
        )
    now = time.time()
    batch_id = "batch_" + unguessable()
    cur.execute(
        "INSERT INTO batches (id, owner, endpoint, input_file_id, completion_window, status, metadata, created_at, "
        "expires_at, total, completed, failed, lease_until, output_expires_s) "
        "VALUES (?, ?, ?, ?, ?, 'validating', ?, ?, ?, 0, 0, 0, 0, ?)",
        (batch_id, owner, endpoint, input_file_id, window, _json(metadata), now, now + window_s, output_expires_s),
    )
    return batch_id


def batch_row(cur: Cursor, batch_id: str, owner: str | None, owners: Owners = EVERY_OWNER) -> tuple[Any, ...] | None:
    """The batch, if `owner` (None: an admin) owns it and `owners` (a team's keys, or every key) picks it."""
    if "\x00" in batch_id:
        return None  # no id holds one, and PostgreSQL's text refuses it
    narrowed = f" AND {owners[0]}" if owners[0] else ""
    found = cur.rows(f"SELECT {BATCH_COLUMNS} FROM batches WHERE id = ?{narrowed}", (batch_id, *owners[1]))
    if not found or (owner is not None and found[0][1] != owner):
        return None
    return found[0]


def counts(cur: Cursor) -> dict[str, int]:
    return {str(s): int(n) for s, n in cur.rows("SELECT status, count(*) FROM batches GROUP BY status")}


def running(cur: Cursor, limit: int, owners: Owners = EVERY_OWNER) -> list[tuple[Any, ...]]:
    """The batches being run (for the status page), those `owners` picks (a team's keys', or every key's): id,
    owner, status, total, completed, failed, created_at."""
    marks = ", ".join("?" * len(ACTIVE))
    narrowed = f" AND {owners[0]}" if owners[0] else ""
    return cur.rows(
        f"SELECT id, owner, status, total, completed, failed, created_at FROM batches WHERE status IN ({marks})"
        f"{narrowed} ORDER BY created_at LIMIT ?",
        (*ACTIVE, *owners[1], limit),
    )


# ---------------------------------------------------------------------------------------------- the runner's


def state(cur: Cursor, batch_id: str, me: str, lease_s: float) -> tuple[Any, ...]:
    return held(cur, batch_id, me, lease_s)


def to_validate(cur: Cursor, batch_id: str, me: str, lease_s: float) -> tuple[str, str] | None:
    """The batch's endpoint and input file, to check (`checking.check`, reading the file a chunk at a time
    outside any transaction: no lock is held while it is parsed); None when it was cancelled meanwhile."""
    status, _, input_file, endpoint = held(cur, batch_id, me, lease_s)[:4]
    if status != "validating":
        return None  # cancelling: the runner ends it without lines
    return str(endpoint), str(input_file)


async def validated(
    db: Store, batch_id: str, me: str, lease_s: float, lines: list[Line], errors: list[BatchError]
) -> None:
    """Store the batch's lines, or the errors that fail it; nothing more once it was cancelled meanwhile.

    One transaction would hold the store's thread for seconds (a million lines: up to tens), and this
    process's other leases, whose renewals wait on that thread, could run out meanwhile: the lines go in
    transactions of at most STORE_LINES lines (STORE_BYTES of bodies), each renewing this lease, the
    store's other work running between them. The batch becomes `in_progress` in a last one, once all are
    stored; a holder that stops part-way (it died, lost the lease) leaves it `validating`, and whoever
    takes it over deletes what it stored (as many at a time) and stores every line again."""
    await unstore_all(db, batch_id, me, lease_s)
    if errors:
        await db.run(check_failed, batch_id, me, lease_s, errors)
        return
    at, refused = 0, 0
    while at < len(lines):
        end, size = at, 0
        while end < len(lines) and end - at < STORE_LINES and size < STORE_BYTES:
            size += len(lines[end].body)
            end += 1
        stored = await db.run(store_lines, batch_id, me, lease_s, lines[at:end], at)
        if stored is None:
            return  # cancelled: the runner ends it, deleting what was stored
        refused += stored
        at = end
    await db.run(lines_stored, batch_id, me, lease_s, len(lines), refused, batch_model(lines))


def unstore(cur: Cursor, batch_id: str, me: str, lease_s: float) -> int:
    """Delete up to STORE_LINES lines of a batch that never became `in_progress` (whose lines a holder
    stopped storing part-way); how many. Such a batch is checked again, or ends, with no lines."""
    held(cur, batch_id, me, lease_s)
    if cur.rows("SELECT in_progress_at FROM batches WHERE id = ?", (batch_id,))[0][0] is not None:
        return 0
    return cur.execute(
        "DELETE FROM batch_lines WHERE batch_id = ? AND idx IN "
        "(SELECT idx FROM batch_lines WHERE batch_id = ? LIMIT ?)",
        (batch_id, batch_id, STORE_LINES),
    )


async def unstore_all(db: Store, batch_id: str, me: str, lease_s: float) -> None:
    """Every line a holder stored part-way gone (`unstore`, in as many transactions as it takes)."""
    while await db.run(unstore, batch_id, me, lease_s):
        pass


def check_failed(cur: Cursor, batch_id: str, me: str, lease_s: float, errors: list[BatchError]) -> None:
    """Fail the batch with the errors its file's check found; nothing when it was cancelled meanwhile."""
    found = held(cur, batch_id, me, lease_s)
    if found[0] != "validating":
        return
    now = time.time()
    cur.execute(
        "UPDATE batches SET status = 'failed', failed_at = ?, errors = ?, lease_until = 0 WHERE id = ?",
        (now, _json([msgspec.structs.asdict(e) for e in errors]), batch_id),
    )
    drop_if_gone(cur, str(found[2]), now)


def store_lines(cur: Cursor, batch_id: str, me: str, lease_s: float, lines: list[Line], first: int) -> int | None:
    """Store `lines` as the batch's lines `first`, `first + 1`...; how many of them are refused (answered
    with their error at once), or None when the batch is no longer `validating` (cancelled)."""
    if held(cur, batch_id, me, lease_s)[0] != "validating":
        return None
    rows: list[tuple[str, int, str, str, str, int, str | None]] = []
    refused = 0
    for i, line in enumerate(lines, first):
        if line.refusal is None:
            rows.append((batch_id, i, line.custom_id, line.body.decode(), TODO, 0, None))
            continue
        refused += 1
        line_id = "batch_req_" + unique_suffix()
        result = answered(line_id, line.custom_id, line.refusal.status, line_id, line.refusal.body()).decode()
        rows.append((batch_id, i, line.custom_id, line.body.decode(), ERR, 0, result))
    for at in range(0, len(rows), _IN_CHUNK):
        cur.executemany(
            "INSERT INTO batch_lines (batch_id, idx, custom_id, body, state, sends, result) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            rows[at : at + _IN_CHUNK],
        )
    return refused


def lines_stored(
    cur: Cursor, batch_id: str, me: str, lease_s: float, total: int, refused: int, model: str | None
) -> None:
    """Every line stored (`store_lines`): the batch's lines may be sent. Nothing when it was cancelled."""
    if held(cur, batch_id, me, lease_s)[0] != "validating":
        return
    cur.execute(
        "UPDATE batches SET status = 'in_progress', in_progress_at = ?, total = ?, failed = ?, model = ? WHERE id = ?",
        (time.time(), total, refused, model, batch_id),
    )


def take(
    cur: Cursor, batch_id: str, me: str, lease_s: float, n: int, max_body: int
) -> tuple[tuple[Any, ...], list[tuple[Any, ...]], int]:
    """The batch's state, up to `n` lines to send now (marked `sent`, one more send each), and how many
    lines were not answered yet (counted only when none is taken). A body over `max_body` bytes is None, not
    read: it was checked under a larger `caps.request_body_bytes`, and the line is refused unsent."""
    found = held(cur, batch_id, me, lease_s)
    if found[0] != "in_progress":
        return found, [], -1
    lines = []
    if n > 0:
        lines = cur.rows(
            f"SELECT idx, custom_id, CASE WHEN {_octets(cur, 'body')} <= ? THEN body END FROM batch_lines "
            f"WHERE batch_id = ? AND state = '{TODO}' ORDER BY idx LIMIT ?",
            (max_body, batch_id, n),
        )
    if lines:
        cur.executemany(
            f"UPDATE batch_lines SET state = '{SENT}', sends = sends + 1 WHERE batch_id = ? AND idx = ?",
            [(batch_id, r[0]) for r in lines],
        )
        return found, lines, -1
    waiting = cur.rows(
        f"SELECT count(*) FROM batch_lines WHERE batch_id = ? AND state IN ('{TODO}', '{SENT}')", (batch_id,)
    )[0][0]
    return found, lines, int(waiting)


def record(
    cur: Cursor, batch_id: str, me: str, lease_s: float, results: list[Booked], db: Database, fold: Fold = same
) -> int:
    """Book answered lines (idx, state ok|err, result line, tokens, ledger row): each only if still `sent`, its
    tokens added to the batch's `usage` and its row to the ledger (`requests`, `daily`, models and targets as
    `fold` names them there) with it, in this one transaction: a line is booked with exactly one row, or
    neither is; how many were booked."""
    held(cur, batch_id, me, lease_s)
    done = {OK: 0, ERR: 0}
    tokens = [0, 0, 0, 0]
    rows = []
    for idx, line_state, result, counted, row in results:
        if cur.execute(
            f"UPDATE batch_lines SET state = ?, result = ? WHERE batch_id = ? AND idx = ? AND state = '{SENT}'",
            (line_state, result, batch_id, idx),
        ):
            done[line_state] += 1
            for i, n in enumerate(counted):
                tokens[i] += n
            if row is not None:
                rows.append(row)
    if rows:
        commit(cur, rows, db, fold)
    if done[OK] or done[ERR]:
        cur.execute(
            "UPDATE batches SET completed = completed + ?, failed = failed + ?, input_tokens = input_tokens + ?, "
            "cached_tokens = cached_tokens + ?, output_tokens = output_tokens + ?, "
            "reasoning_tokens = reasoning_tokens + ? WHERE id = ?",
            (done[OK], done[ERR], *tokens, batch_id),
        )
    return done[OK] + done[ERR]


def left(cur: Cursor, batch_id: str) -> list[tuple[int, str]]:
    """The lines not answered yet (idx, custom_id)."""
    rows = cur.rows(
        f"SELECT idx, custom_id FROM batch_lines WHERE batch_id = ? AND state IN ('{TODO}', '{SENT}') ORDER BY idx",
        (batch_id,),
    )
    return [(int(r[0]), str(r[1])) for r in rows]


def finish(
    cur: Cursor,
    batch_id: str,
    me: str,
    lease_s: float,
    status: str,
    closed: list[tuple[int, str]],
    reason: str | None = None,
) -> None:
    """End the batch: the lines in `closed` (idx, error line) go to the error file, the result files are made
    from the lines, and the batch takes its final `status` (completed, failed, expired, cancelled)."""
    input_file = held(cur, batch_id, me, lease_s)[2]
    now = time.time()
    # The lines closed were read unanswered under this lease, which is still held: each of them is updated.
    cur.executemany(
        f"UPDATE batch_lines SET state = '{ERR}', result = ? WHERE batch_id = ? AND idx = ? "
        f"AND state IN ('{TODO}', '{SENT}')",
        [(result, batch_id, idx) for idx, result in closed],
    )
    closed_n = len(closed)
    owner, expires_s = cur.rows("SELECT owner, output_expires_s FROM batches WHERE id = ?", (batch_id,))[0]
    ids: dict[str, str | None] = {}
    for line_state, purpose in ((OK, "output"), (ERR, "error")):
        # Summed by the database: the results of a large batch are more than this process should hold at once.
        size = int(
            cur.rows(
                f"SELECT coalesce(sum({_octets(cur, 'result')} + 1), 0) FROM batch_lines "
                "WHERE batch_id = ? AND state = ?",
                (batch_id, line_state),
            )[0][0]
        )
        ids[purpose] = add_result(cur, owner, batch_id, purpose, line_state, size, expires_s) if size else None
    stamp = {"completed": "completed_at", "failed": "failed_at", "expired": "expired_at", "cancelled": "cancelled_at"}
    errors = None
    if reason is not None:
        errors = _json([{"code": "batch_failed", "message": reason, "param": None, "line": None}])
    cur.execute(
        f"UPDATE batches SET status = ?, {stamp[status]} = ?, finalizing_at = coalesce(finalizing_at, ?), "
        "failed = failed + ?, output_file_id = ?, error_file_id = ?, reason = ?, errors = coalesce(?, errors), "
        "lease_owner = NULL, lease_until = ? WHERE id = ?",
        (status, now, now, closed_n, ids["output"], ids["error"], reason, errors, 0, batch_id),
    )
    drop_if_gone(cur, input_file, now)  # deleted (or expired) while the batch ran: its rows go now


def retain(cur: Cursor, before: float, limit: int) -> int:
    """Delete finished batches, their lines and files, and files, made before `before`; how many objects."""
    marks = ", ".join("?" * len(TERMINAL))
    old = [
        r[0]
        for r in cur.rows(
            f"SELECT id FROM batches WHERE status IN ({marks}) AND created_at < ? LIMIT ?", (*TERMINAL, before, limit)
        )
    ]
    for batch_id in old:
        cur.execute("DELETE FROM batch_lines WHERE batch_id = ?", (batch_id,))
        cur.execute("DELETE FROM batch_files WHERE batch_id = ?", (batch_id,))  # its output and error files
        cur.execute("DELETE FROM batches WHERE id = ?", (batch_id,))
    # A file a running batch still reads is kept: its batch is not finished, so it is not old. So are files
    # past their own expiry, which are already gone to their owners.
    files = expired(cur, time.time(), before, None, limit)
    drop(cur, files)
    return len(old) + len(files)


def _json(value: Any) -> str | None:
    return None if value is None else msgspec.json.encode(value).decode()
