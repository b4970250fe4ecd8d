"""The Batch API's files in the ledger's database: an upload stored in chunks, the result files a batch makes,
and when each expires.

A file may carry an expiry (OpenAI's `expires_after`, anchored at its creation; a batch's `output_expires_after`
for the files it makes). From that moment it is gone to its owner: not read, not listed, not counted against
`batches.max_files`; its rows are deleted with the owner's next upload and by the runner's hourly sweep. A file
a batch still running reads is kept until that batch ends, as retention keeps it. A file deleted is expired
the same way, its rows deleted at once unless a batch not ended still reads it.

Every file counts toward its owner's caps (`batches.max_files`, `max_key_bytes`, its team's), the result files a
batch makes as much as uploads: they fill the same disk. Only an upload is ever refused for them: a batch's
results are stored whole, past the caps, and the next upload waits for files to be deleted.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Final, NamedTuple

from gateway.batches import locks
from gateway.batches.objects import TERMINAL
from gateway.ids import unguessable
from gateway.ledger.engine import Cursor

CHUNK_BYTES: Final = 1024 * 1024  # an uploaded file is stored in chunks of this size
FILE_COLUMNS: Final = "id, owner, filename, purpose, bytes, created_at, batch_id, kind, expires_at"
# The kind of an upload's row while its chunks are still arriving: seen by no one (not read, listed or counted).
PARTIAL: Final = "partial"
# An upload still arriving this long after it began is abandoned: its row expires, and whatever deletes
# expired files (the owner's next upload, the runner's sweep) deletes it with its chunks. It is what a
# process that died mid-upload leaves behind; a live one deletes what it stored of an upload it refuses.
UPLOAD_S: Final = 86_400.0
# A file's row read by its owner: complete and unexpired (an expiry of NULL is none).
UNEXPIRED: Final = f"(kind <> '{PARTIAL}' AND (expires_at IS NULL OR expires_at > ?))"
# A file no batch not ended yet reads (as its input); the parameters: TERMINAL.
_UNREAD: Final = f"id NOT IN (SELECT input_file_id FROM batches WHERE status NOT IN ({', '.join('?' * len(TERMINAL))}))"


class TooManyFiles(Exception):
    """The key holds `batches.max_files` files already."""


class TooManyBytes(Exception):
    """The upload would take the key's files (or its team's) past `batches.max_key_bytes` (or the team's)."""


class TeamCaps(NamedTuple):
    """A team's caps over the files of all its keys together (`teams.<name>.max_batch_bytes`, `max_batch_files`),
    checked with each key's own; `owners` picks its keys' rows (`store.team_owners`: a condition, its arguments)."""

    name: str
    owners: tuple[str, Sequence[Any]]
    max_bytes: int
    max_files: int


class _Stored(NamedTuple):
    """What the files of some owners hold: `files` and their `held` bytes, the uploads complete and the batches'
    result files alike (the ledger's disk holds both); `arriving`, those bytes with the uploads still arriving."""

    files: int
    held: int
    arriving: int


class UploadGone(Exception):
    """The upload's row was deleted while it arrived: it took longer than UPLOAD_S."""


def begin_upload(cur: Cursor, owner: str) -> str:
    """The row an upload's chunks are stored under as they arrive (PARTIAL until `finish_upload`); its id."""
    return str(_insert(cur, owner, "", "batch", 0, None, PARTIAL, UPLOAD_S)[0])


def add_chunk(
    cur: Cursor,
    file_id: str,
    seq: int,
    data: bytes,
    owner: str = "",
    max_bytes: int | None = None,
    team: TeamCaps | None = None,
) -> None:
    """Store the upload's chunk `seq`, its row still there (an abandoned upload's chunks would be no one's).
    Its row counts what is stored so far, and `max_bytes` holds for the owner's files and every upload of its
    still arriving together: many uploads at once cannot fill the database past it before any one finishes.
    So does the `team`'s cap, for all its keys' together."""
    if max_bytes is not None or team is not None:
        locks.hold(cur, owner, None if team is None else team.name)
    if not cur.execute(
        "UPDATE batch_files SET bytes = bytes + ? WHERE id = ? AND kind = ?", (len(data), file_id, PARTIAL)
    ):
        raise UploadGone
    if max_bytes is not None and (held := _stored(cur, "owner = ?", (owner,)).arriving) > max_bytes:
        # Rolled back with the transaction: the row's count stays what is stored.
        raise TooManyBytes(
            f"this key's files, with the uploads still arriving, would hold {held} bytes, past the "
            f"{max_bytes} batches.max_key_bytes allows: delete some first"
        )
    if team is not None and (held := _stored(cur, *team.owners).arriving) > team.max_bytes:
        raise TooManyBytes(
            f"the files of team {team.name!r}, with the uploads still arriving, would hold {held} bytes, past the "
            f"{team.max_bytes} teams.{team.name}.max_batch_bytes allows: delete some first"
        )
    cur.execute("INSERT INTO batch_file_chunks (file_id, seq, data) VALUES (?, ?, ?)", (file_id, seq, data))


def _stored(cur: Cursor, where: str, args: Sequence[Any]) -> _Stored:
    """What the files of the owners `where` picks hold, unexpired, in one query: the caps on files and on bytes
    count the same rows."""
    whole = f"kind <> '{PARTIAL}'"
    files, held, arriving = cur.rows(
        f"SELECT coalesce(sum(CASE WHEN {whole} THEN 1 ELSE 0 END), 0), "
        f"coalesce(sum(CASE WHEN {whole} THEN bytes ELSE 0 END), 0), coalesce(sum(bytes), 0) "
        f"FROM batch_files WHERE {where} AND (expires_at IS NULL OR expires_at > ?)",
        (*args, time.time()),
    )[0]
    return _Stored(int(files), int(held), int(arriving))


def finish_upload(
    cur: Cursor,
    file_id: str,
    owner: str,
    filename: str,
    size: int,
    max_files: int,
    expires_s: float | None = None,
    max_bytes: int | None = None,
    team: TeamCaps | None = None,
) -> tuple[Any, ...]:
    """Make the upload whose `size` bytes are stored a file of its owner's, made now and expiring `expires_s`
    after; the owner's expired files go first. The caps (the key's, its `team`'s) are checked here, once its
    size is known: a refused upload's rows are the caller's to delete (`drop`)."""
    locks.hold(cur, owner, None if team is None else team.name)
    drop(cur, expired(cur, time.time(), None, owner))
    kept, held, _ = _stored(cur, "owner = ?", (owner,))
    if kept >= max_files:
        raise TooManyFiles(f"this key holds {kept} files, the most batches.max_files allows: delete some first")
    if max_bytes is not None and held + size > max_bytes:
        raise TooManyBytes(
            f"this key's files hold {held} bytes; {size} more would pass the {max_bytes} "
            "batches.max_key_bytes allows: delete some first"
        )
    if team is not None:
        _team_fits(cur, team, size)
    now = time.time()
    expires_at = None if expires_s is None else now + expires_s
    done = cur.execute(
        "UPDATE batch_files SET filename = ?, bytes = ?, created_at = ?, kind = 'input', expires_at = ? "
        "WHERE id = ? AND kind = ?",
        (filename, size, now, expires_at, file_id, PARTIAL),
    )
    if not done:
        raise UploadGone
    return (file_id, owner, filename, "batch", size, now, None, "input", expires_at)


def _team_fits(cur: Cursor, team: TeamCaps, size: int) -> None:
    """`TooManyFiles` or `TooManyBytes` when one more file of `size` bytes would pass the team's caps."""
    kept, held, _ = _stored(cur, *team.owners)
    if kept >= team.max_files:
        raise TooManyFiles(
            f"the keys of team {team.name!r} hold {kept} files, the most teams.{team.name}.max_batch_files allows: "
            "delete some first"
        )
    if held + size > team.max_bytes:
        raise TooManyBytes(
            f"the files of team {team.name!r} hold {held} bytes; {size} more would pass the {team.max_bytes} "
            f"teams.{team.name}.max_batch_bytes allows: delete some first"
        )


def add_result(
    cur: Cursor, owner: str, batch_id: str, purpose: str, line_state: str, size: int, expires_s: float | None
) -> str:
    """A batch's output or error file (its lines stay in `batch_lines`); its id. Its `size` counts toward its
    owner's bytes, but no cap refuses it: a batch's results are never cut."""
    row = _insert(cur, owner, f"{batch_id}_{purpose}.jsonl", "batch_output", size, batch_id, line_state, expires_s)
    return str(row[0])


def _insert(
    cur: Cursor,
    owner: str,
    filename: str,
    purpose: str,
    size: int,
    batch_id: str | None,
    kind: str,
    expires_s: float | None,
) -> tuple[Any, ...]:
    """A file's row, made now and expiring `expires_s` after (None: only retention deletes it)."""
    now = time.time()
    expires_at = None if expires_s is None else now + expires_s
    row = ("file-" + unguessable(), owner, filename, purpose, size, now, batch_id, kind, expires_at)
    cur.execute(f"INSERT INTO batch_files ({FILE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", row)
    return row


def file_row(cur: Cursor, file_id: str, owner: str | None) -> tuple[Any, ...] | None:
    """The file, if `owner` (None: the admin) may see it and it has not expired."""
    if "\x00" in file_id:
        return None  # no id holds one, and PostgreSQL's text refuses it
    found = cur.rows(f"SELECT {FILE_COLUMNS} FROM batch_files WHERE id = ? AND {UNEXPIRED}", (file_id, time.time()))
    if not found or (owner is not None and found[0][1] != owner):
        return None
    return found[0]


def input_data(cur: Cursor, file_id: str) -> bytes:
    rows = cur.rows("SELECT data FROM batch_file_chunks WHERE file_id = ? ORDER BY seq", (file_id,))
    return b"".join(bytes(r[0]) for r in rows)


def input_chunk(cur: Cursor, file_id: str, seq: int) -> bytes | None:
    """The upload's stored chunk `seq` (None past its last): its content is sent a chunk at a time, so a
    download holds CHUNK_BYTES of it, not the whole file, however slowly the client reads."""
    rows = cur.rows("SELECT data FROM batch_file_chunks WHERE file_id = ? AND seq = ?", (file_id, seq))
    return bytes(rows[0][0]) if rows else None


def delete_file(cur: Cursor, file_id: str, owner: str | None) -> bool:
    """Delete the file for its owner at once; its rows go now, or (the input of a batch not ended, which may
    not have read it yet: one waiting for a runner) once no such batch reads it, as an expired file's."""
    if file_row(cur, file_id, owner) is None:
        return False
    now = time.time()
    cur.execute("UPDATE batch_files SET expires_at = ? WHERE id = ?", (now, file_id))
    drop_if_gone(cur, file_id, now)
    return True


def drop_if_gone(cur: Cursor, file_id: str, now: float) -> None:
    """Delete the file's rows if it is past its expiry and no batch not ended reads it (the runner's sweep
    deletes the others, later)."""
    gone = cur.rows(
        f"SELECT id FROM batch_files WHERE id = ? AND expires_at <= ? AND {_UNREAD}", (file_id, now, *TERMINAL)
    )
    drop(cur, [r[0] for r in gone])


def expired(cur: Cursor, now: float, before: float | None, owner: str | None, limit: int = 10_000) -> list[str]:
    """Files past their expiry (or, with `before`, also made before it), `owner`'s only unless None, that no
    batch still running reads."""
    old, params = ("OR created_at < ?", [before]) if before is not None else ("", [])
    mine, who = ("AND owner = ?", [owner]) if owner is not None else ("", [])
    return [
        r[0]
        for r in cur.rows(
            f"SELECT id FROM batch_files WHERE (expires_at <= ? {old}) {mine} AND {_UNREAD} LIMIT ?",
            (now, *params, *who, *TERMINAL, limit),
        )
    ]


def drop(cur: Cursor, file_ids: list[str]) -> None:
    for file_id in file_ids:
        cur.execute("DELETE FROM batch_file_chunks WHERE file_id = ?", (file_id,))
        cur.execute("DELETE FROM batch_files WHERE id = ?", (file_id,))


__all__ = [
    "CHUNK_BYTES",
    "FILE_COLUMNS",
    "PARTIAL",
    "TeamCaps",
    "UNEXPIRED",
    "UPLOAD_S",
    "TooManyBytes",
    "TooManyFiles",
    "UploadGone",
    "add_chunk",
    "add_result",
    "begin_upload",
    "delete_file",
    "drop",
    "drop_if_gone",
    "expired",
    "file_row",
    "finish_upload",
    "input_chunk",
    "input_data",
]
