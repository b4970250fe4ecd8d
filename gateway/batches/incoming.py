"""An upload being stored as it arrives: its chunks written to the ledger's database one at a time, under a
file row no one sees until the upload is whole and within its key's caps.

Each chunk is a transaction of its own on the store's thread, so a large upload neither holds the file in
memory nor keeps the thread (and the runner's lease renewals waiting on it) for the whole of one write.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from gateway.batches import files
from gateway.batches.store import Store
from gateway.ledger.engine import LedgerDown

log = logging.getLogger("gateway")


class Incoming:
    """One upload's chunks in the store, as `write` is given them; `finish` makes them a file, `abandon`
    deletes them."""

    def __init__(
        self, store: Store, owner: str, max_bytes: int | None = None, team: files.TeamCaps | None = None
    ) -> None:
        self.store = store
        self.owner = owner
        self.max_bytes = max_bytes  # `batches.max_key_bytes`, checked as each chunk is stored
        self.team = team  # the caps of the owner's team, checked with the key's
        self.file_id: str | None = None  # its row, made with its first chunk
        self.seq = 0

    async def write(self, data: bytes) -> None:
        if self.file_id is None:
            self.file_id = await self.store.run(files.begin_upload, self.owner)
        await self.store.run(files.add_chunk, self.file_id, self.seq, data, self.owner, self.max_bytes, self.team)
        self.seq += 1

    async def finish(
        self, filename: str, size: int, max_files: int, expires_s: float | None, max_bytes: int
    ) -> tuple[Any, ...]:
        """The File's row (an empty file has no chunk, so its row is made here). Raises `files.TooManyFiles`,
        `files.TooManyBytes` or `files.UploadGone`, its chunks left for `abandon`."""
        if self.file_id is None:
            self.file_id = await self.store.run(files.begin_upload, self.owner)
        args = (self.file_id, self.owner, filename, size, max_files, expires_s, max_bytes, self.team)
        return await self.store.run(files.finish_upload, *args)

    async def abandon(self) -> None:
        """Delete what was stored of a refused upload. Shielded: an upload cut by its client (its task
        cancelled) still deletes its chunks; one this fails to delete (the database down) is deleted as
        expired once `files.UPLOAD_S` has passed."""
        if self.file_id is None:
            return
        file_id, self.file_id = self.file_id, None

        async def drop() -> None:
            try:
                await self.store.run(files.drop, [file_id])
            except LedgerDown as exc:
                log.warning("batches: a refused upload's chunks stay stored until it expires: %s", exc)

        await asyncio.shield(asyncio.ensure_future(drop()))


__all__ = ["Incoming"]
