"""A process's spill file: where the ledger's rows wait while the database cannot be written.

One file per process (`ledger-spill-<pid>-<random>.jsonl`, one JSON array of rows per line), locked while the
process lives, bounded by `ledger.spill_bytes`; rows that find it full, or that it cannot take (a disk full, a
directory that cannot be made), are counted as lost. Files of processes that died (their lock is free) are
replayed by whichever process finds them (gateway/ledger/book.py).
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Final

import msgspec

from gateway.ledger.batch import Row

SPILL_PREFIX: Final = "ledger-spill-"
_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder(list[list[Any]]).decode


class Spill:
    """This process's spill file (locked while it lives) and the replay of every spill file in the directory."""

    def __init__(self, directory: Path, max_bytes: int, prefix: str = "", what: str = "spill file") -> None:
        self.dir = directory
        self.what = what  # how `trouble` names the file
        self.max_bytes = max_bytes
        self.path = directory / f"{prefix or SPILL_PREFIX}{os.getpid()}-{os.urandom(6).hex()}.jsonl"
        self._fd: int | None = None
        self.size = 0
        self.lost = 0  # rows that found the spill file full, or could not be written to it
        self.trouble = ""  # why the last rows were lost
        self.done = 0  # batches of this file booked already (by a replay the database then interrupted)

    def write(self, rows: Sequence[Row]) -> bool:
        """Append one batch (one line); False, and the rows counted as lost, when the file is full or cannot be
        written (`trouble` says which)."""
        data = _encode([list(r) for r in rows]) + b"\n"
        if self.size + len(data) > self.max_bytes:
            self.lost += len(rows)
            self.trouble = f"the {self.what} is full (ledger.spill_bytes = {self.max_bytes})"
            return False
        try:
            if self._fd is None:
                self.dir.mkdir(parents=True, exist_ok=True)
                self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
                fcntl.flock(self._fd, fcntl.LOCK_EX)
            view = memoryview(data)
            while view:  # a write cut short (a disk filling up) goes on from where it stopped, or fails below
                view = view[os.write(self._fd, view) :]
            os.fsync(self._fd)
        except OSError as exc:  # a disk full, a directory that cannot be made: the rows are lost, and counted
            if self._fd is not None:
                # Half a line would join the next batch's line, and that batch would be lost on replay too.
                with contextlib.suppress(OSError):
                    os.ftruncate(self._fd, self.size)
            self.lost += len(rows)
            self.trouble = f"the {self.what} {self.path} cannot be written ({why(exc)})"
            return False
        self.size += len(data)
        return True

    @property
    def waiting(self) -> bool:
        return self.size > 0

    def files(self) -> list[Path]:
        """Every spill file in the directory, this process's own included, oldest process first."""
        return sorted(self.dir.glob(f"{SPILL_PREFIX}*.jsonl")) if self.dir.is_dir() else []

    def batches(self, others: bool) -> Iterator[tuple[Path, list[list[Any]]]]:
        """Every spilled batch: this process's own, then (with `others`) those of processes that died (their
        lock is free)."""
        if self._fd is not None:
            yield from ((self.path, b) for b in _read(self.path, self.done))
        if not others:
            return
        for other in self._unheld(os.O_RDWR, fcntl.LOCK_EX):
            yield from ((other, b) for b in _read(other))
            other.unlink(missing_ok=True)  # every batch committed: the caller stops at the first failure

    def left(self) -> Iterator[list[list[Any]]]:
        """The batches of other processes' files that no process holds (left by processes that died), read
        without replaying them: what waits there, for the views to count until it is replayed."""
        for other in self._unheld(os.O_RDONLY, fcntl.LOCK_SH):
            yield from _read(other)

    def _unheld(self, mode: int, lock: int) -> Iterator[Path]:
        """Other processes' spill files whose lock is free (their process died), each held with `lock` while the
        caller reads it; a live process's file is skipped: it replays and counts its own."""
        for other in self.files():
            if other == self.path:
                continue
            try:
                fd = os.open(other, mode)
            except OSError:
                continue
            try:
                try:
                    fcntl.flock(fd, lock | fcntl.LOCK_NB)
                except OSError:
                    continue
                yield other
            finally:
                os.close(fd)

    def replayed(self) -> None:
        """Every batch of this process's own file is committed: start it afresh."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
            self.path.unlink(missing_ok=True)
        self.size = 0
        self.done = 0


def why(exc: BaseException) -> str:
    """An error in one line: its type and the first line of its message."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def _read(path: Path, skip: int = 0) -> Iterator[list[list[Any]]]:
    """The file's batches after its first `skip` lines, one line decoded at a time: a replay that stops at its
    first batch (the database still away) decodes that one, not the whole file."""
    with contextlib.suppress(FileNotFoundError), path.open("rb") as f:
        for line in itertools.islice(f, skip, None):
            try:
                batch = _decode(line)
            except msgspec.DecodeError:  # a line cut by a crash mid-write
                continue
            yield batch
