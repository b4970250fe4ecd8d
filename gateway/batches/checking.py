"""A batch's input file checked as it is read from the database, a stored chunk at a time, its lines stored
as they are found valid: the runner holds a few MiB of a file, whatever its size, never the whole of it
(several batches of 100 MiB files being checked at once would be what pushes a process out of memory).

Two reads: the first counts the lines (a file of too many, or over `batches.max_file_bytes`, is refused
before any line is read); the second checks each line as it completes (`lines.Checker`; one longer than
`caps.request_body_bytes` is only counted past it, never held whole, and refused) and stores the
valid ones in transactions of at most STORE_LINES lines (STORE_BYTES of bodies). Once a line is not valid
nothing more is stored: the rest of the file is read for its errors (at most MAX_ERRORS), then what was
stored is deleted and the batch fails. Every chunk read renews the batch's lease, so a check that outlasts
`batches.lease_ms` is not taken over.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from gateway.batches.custom_ids import TAIL_BYTES, head_id, tail_id
from gateway.batches.files import input_chunk
from gateway.batches.leases import held
from gateway.batches.lines import MAX_ERRORS, Checker, Line, Skipped, up_front
from gateway.batches.store import STORE_BYTES, STORE_LINES, Store, check_failed, lines_stored, store_lines, unstore_all
from gateway.ledger.engine import Cursor


def _chunk(cur: Cursor, batch_id: str, me: str, lease_s: float, file_id: str, seq: int) -> bytes | None:
    """The file's chunk `seq` (None past its last), the batch's lease renewed; empty (no stored chunk is) once
    the batch is no longer `validating`."""
    if held(cur, batch_id, me, lease_s)[0] != "validating":
        return b""
    return input_chunk(cur, file_id, seq)


class _Cancelled(Exception):
    """The batch was cancelled while its file was read: the runner ends it, deleting what was stored."""


async def _chunks(db: Store, batch_id: str, me: str, lease_s: float, file_id: str) -> AsyncIterator[bytes]:
    seq = 0
    while (chunk := await db.run(_chunk, batch_id, me, lease_s, file_id, seq)) is not None:
        if not chunk:
            raise _Cancelled
        yield chunk
        seq += 1


class _Count:
    """The file's size, its lines (a blank after the last newline is none) and the line holding its byte
    `max_bytes + 1`, counted a chunk at a time."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.size = 0
        self.ends = 0  # newlines
        self.over = 0  # newlines before byte `max_bytes + 1`, plus one
        self.tail_blank = True  # the bytes after the last newline are blank

    def feed(self, chunk: bytes) -> None:
        if self.size <= self.max_bytes < self.size + len(chunk):
            self.over = self.ends + chunk.count(b"\n", 0, self.max_bytes - self.size) + 1
        self.size += len(chunk)
        self.ends += chunk.count(b"\n")
        last = chunk.rfind(b"\n")
        self.tail_blank = not chunk[last + 1 :].strip() and (last >= 0 or self.tail_blank)

    @property
    def count(self) -> int:
        return self.ends if self.tail_blank else self.ends + 1


class _Long:
    """A line past `max_line` as its bytes go by: its length so far, the custom_id among the members it opens
    with (read from its first `max_line` bytes, the part held before it went over) and its last TAIL_BYTES,
    for the custom_id among the members it ends with; the rest counted, never kept."""

    def __init__(self, head: list[bytes], max_line: int) -> None:
        whole = b"".join(head)
        self.size = len(whole)
        self.custom_id = head_id(whole, max_line)
        self.tail = whole[-TAIL_BYTES:]

    def feed(self, piece: bytes) -> None:
        self.size += len(piece)
        if self.custom_id is None:
            self.tail = (self.tail + piece[-TAIL_BYTES:])[-TAIL_BYTES:]

    def ended(self, last: bytes) -> Skipped:
        self.feed(last)
        return Skipped(self.size, self.custom_id if self.custom_id is not None else tail_id(self.tail))


async def _rows(chunks: AsyncIterator[bytes], count: int, max_line: int) -> AsyncIterator[list[bytes | Skipped]]:
    """The file's first `count` lines, without their newline, in the lists each chunk completes; a line over
    `max_line` bytes is `Skipped` instead, never held whole: a line of 100 MiB with no newline costs about a
    chunk and twice `max_line` (its start, joined once for its custom_id) and TAIL_BYTES of its end, not its size."""
    carry: list[bytes] = []  # the start of the line no chunk has ended yet (joined once: it may span many)
    held = 0  # bytes in `carry`
    long: _Long | None = None  # the line being read, once past `max_line`
    left = count
    async for chunk in chunks:
        split = chunk.split(b"\n")
        tail = split.pop()
        if split:
            rows: list[bytes | Skipped] = list(split)
            if long is None and held + len(split[0]) > max_line:
                rows[0] = _Long([*carry, split[0]], max_line).ended(b"")
            elif long is not None:
                rows[0] = long.ended(split[0])
            elif carry:
                rows[0] = b"".join([*carry, split[0]])
            carry.clear()
            held, long = 0, None
            yield rows[:left]
            left -= min(left, len(rows))
            if not left:
                return
        if long is None and held + len(tail) > max_line:
            long = _Long([*carry, tail], max_line)
            carry.clear()
            held = 0
        elif long is not None:
            long.feed(tail)
        elif tail:
            carry.append(tail)
            held += len(tail)
    if left:
        yield [long.ended(b"") if long is not None else b"".join(carry)]


async def check(
    db: Store,
    batch_id: str,
    me: str,
    lease_s: float,
    endpoint: str,
    file_id: str,
    max_lines: int,
    max_bytes: int,
    max_line: int,
) -> None:
    """Check the batch's input file and store its lines, or fail the batch with the errors naming them;
    nothing more once it was cancelled meanwhile. No line over `max_line` bytes is held whole."""
    await unstore_all(db, batch_id, me, lease_s)  # what a holder that stopped part-way stored
    try:
        counted = _Count(max_bytes)
        async for chunk in _chunks(db, batch_id, me, lease_s, file_id):
            counted.feed(chunk)
        errors = up_front(counted.size, counted.over, counted.count, max_lines, max_bytes)
        if errors:
            await db.run(check_failed, batch_id, me, lease_s, errors)
            return
        checker = Checker(endpoint, max_line)
        pending: list[Line] = []  # valid lines not stored yet: one transaction's, and a chunk's
        refused, number = 0, 0  # while every line is valid, `pending` holds the last of the `number` read
        async for rows in _rows(_chunks(db, batch_id, me, lease_s, file_id), counted.count, max_line):
            first = number + 1
            number += len(rows)
            # Off the event loop: a chunk may complete one line of many MiB.
            found = await asyncio.to_thread(_check_rows, checker, rows, first)
            if checker.errors:
                pending.clear()  # nothing more is stored
                if len(checker.errors) >= MAX_ERRORS:
                    break
                continue
            pending += [line for line in found if line is not None]
            while _cut(pending) < len(pending):  # a whole transaction's lines, and more
                refused += await _store(db, batch_id, me, lease_s, pending, number - len(pending))
        if checker.errors:
            await unstore_all(db, batch_id, me, lease_s)
            await db.run(check_failed, batch_id, me, lease_s, checker.errors)
            return
        while pending:
            refused += await _store(db, batch_id, me, lease_s, pending, number - len(pending))
        await db.run(lines_stored, batch_id, me, lease_s, number, refused, checker.model())
    except _Cancelled:
        return


def _check_rows(checker: Checker, rows: list[bytes | Skipped], first: int) -> list[Line | None]:
    return [checker.line(number, raw) for number, raw in enumerate(rows, first)]


def _cut(pending: list[Line]) -> int:
    """How many of the first lines go in one transaction: STORE_LINES, STORE_BYTES of bodies (or one line)."""
    end, size = 0, 0
    while end < len(pending) and end < STORE_LINES and size < STORE_BYTES:
        size += len(pending[end].body)
        end += 1
    return end


async def _store(db: Store, batch_id: str, me: str, lease_s: float, pending: list[Line], first: int) -> int:
    """Store the first lines of `pending` (`_cut`), taking them out of it, as the batch's lines `first`,
    `first + 1`...; how many of them were refused."""
    end = _cut(pending)
    refused = await db.run(store_lines, batch_id, me, lease_s, pending[:end], first)
    if refused is None:
        raise _Cancelled
    del pending[:end]
    return refused


__all__ = ["check"]
