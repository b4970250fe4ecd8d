"""Rows in, never on the request path, never lost: a bounded queue, one writer, a spill file.

`Ledger.append` is the request path's whole share: one append to a bounded deque (a full queue counts the row as
dropped, it never waits). The writer takes what waits every `flush_ms`, or as soon as `batch_rows` rows wait, turns
it into a batch of rows (gateway/ledger/batch.py) and commits them with their daily rollups in one transaction, on
the ledger's own thread. When the database cannot be written, the batch goes to a spill file of this process
(bounded by `spill_bytes`), which is replayed before anything newer once the database answers; every row carries an
id of its own, so a replay that is interrupted and done again books nothing twice. Spill files left by a process
that died (no one holds their lock) are replayed by whichever replica finds them.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Coroutine, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Final

from gateway.config import LedgerConfig
from gateway.ledger.batch import (
    Batch,
    Fold,
    Pending,
    Rollups,
    Row,
    commit_batch,
    lost_pending,
    pending,
    rollups,
    same,
    take,
    text,
)
from gateway.ledger.engine import Cursor, Database, LedgerDown
from gateway.ledger.replay import added, commit, spilled_rollups
from gateway.ledger.spill import Spill, why
from gateway.limits.usage import day_of
from gateway.ops.metrics import Record

log = logging.getLogger("gateway")

_RETAIN_EVERY_S: Final = 3600
_ORPHANS_EVERY_S: Final = 60
_RETAIN_BATCH: Final = 5000  # SQLite: rows per DELETE (one short transaction each)
_RETAIN_BATCHES: Final = 200  # ... and at most this many per turn; the rest waits for the next turn
_MARGIN_S: Final = 1.0  # what a `call` waits beyond `ledger.timeout_ms`, the database's own bound
_COMMIT_S: Final = 0.5  # of that margin, what a `change` keeps for its COMMIT
# Rows the database refused alone, one batch per line as in a spill file, never replayed: for the operator.
_REJECTS_PREFIX: Final = "ledger-refused-"


class Ledger:
    """The process's ledger: the queue, the writer task, the database thread, and the keys' poller."""

    def __init__(self, cfg: LedgerConfig) -> None:
        self.cfg = cfg
        # Two connections, each on its own thread: the writer's (rows, rollups, retention, and whatever adds the
        # queue's rows to what it reads: the usage views and budgets' seeds, which must read behind the batches
        # it has taken: `read`) and the one everything else asks through `call` (keys), so that neither waits
        # behind the other, and every wait for the database is bounded by `timeout_ms`.
        self.db = Database(cfg.url, cfg.timeout_ms)
        self.rows = Database(cfg.url, cfg.timeout_ms)
        # The config in force's names for models and targets in the rollups (set by each pipeline it serves).
        self.fold: Fold = same
        # Why the database did not answer the last `call` (None: it did), for /ready and the budgets.
        self.unanswered: str | None = None
        # Row ids: drawn here, in the worker, so that forked workers never share a prefix.
        # Ids sort in the order they are drawn (the start time first, then a counter of fixed width), so a
        # batch's rows are appended at the end of the primary key's index instead of spread through it.
        self._prefix = f"{int(time.time()):08x}{os.urandom(6).hex()}"
        self._ids = itertools.count(10**9)  # ten digits for the first nine billion rows
        self.queue: deque[Pending] = deque()
        # Rows `hold` handed out, not committed yet (as far as this process knows): `read` counts them.
        self.held: dict[str, Pending] = {}
        self._null = None if self.db.postgres else 0  # an absent prompt or completion (`batch.Batch`)
        self.cap = cfg.queue_rows
        self.batch_rows = cfg.batch_rows
        self.dropped = 0  # rows the full queue turned away
        self._dropped_logged = 0
        self.booked = 0
        self.late_changes = 0  # key changes committed after their caller was answered 503 (`change`)
        self.expired = 0  # spilled rows of days retention removes, not booked at replay
        self.refused = 0  # rows the database refused alone (kept in `rejects`, never booked)
        # The rollups of this process's rows in its spill file, not booked yet: what `read` adds to what the
        # database holds, so a budget seeded during an outage of writes still counts them. Replaced whole on the
        # writer's thread, and read there.
        self.spilled: Rollups = {}
        # The rollups of the rows in spill files other processes left (a restart while the database took no
        # writes), counted the same way until they are replayed.
        self.orphaned: Rollups = {}
        self._spilled_parts: deque[Rollups] = deque()  # the same, per batch of the spill file, oldest first
        self.refused_why = ""
        self.down: str | None = None  # why the database could not be written, while it cannot
        # `spill.lost` when this outage first lost rows to the spill file (None: it has lost none).
        self._lost_at: int | None = None
        spill_dir = Path(cfg.spill_dir) if cfg.spill_dir else self._default_spill_dir()
        self.spill = Spill(spill_dir, cfg.spill_bytes)
        self.rejects = Spill(spill_dir, cfg.spill_bytes, _REJECTS_PREFIX, "refused-rows file")
        # `rejects.lost` when the refused-rows file first failed to take rows (None: it takes them).
        self._rejects_lost_at: int | None = None
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="ledger")
        self._writer_pool = ThreadPoolExecutor(1, thread_name_prefix="ledger-writer")
        # A caller waits for the database's own bound (its statement timeout), plus a margin, and no longer:
        # a server that does not answer at all is an answer too.
        self._wait_s = cfg.timeout_ms / 1000 + _MARGIN_S
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._orphans_at = 0.0
        self._retain_at = 0.0  # retention runs at the first turn, then every _RETAIN_EVERY_S

    @property
    def spilling(self) -> int:
        return int(self.spill.waiting)

    def _default_spill_dir(self) -> Path:
        if self.db.postgres:
            return Path("ledger-spill")
        return Path(self.db.target).resolve().parent

    # ------------------------------------------------------------------------------ the request path

    def append(self, rec: Record, elapsed_s: float) -> None:
        queue = self.queue
        if len(queue) >= self.cap:
            self.dropped += 1
            return
        queue.append(pending(rec, elapsed_s, time.time(), self._null))
        if rec.lost is not None:
            self.append_lost(rec, elapsed_s)
        if len(queue) == self.batch_rows and self._wake is not None:
            self._wake.set()

    def append_lost(self, rec: Record, elapsed_s: float) -> None:
        """The rows of the calls `rec` paid for and did not use (hedges that lost), each at its own target."""
        for row in lost_pending(rec, elapsed_s, time.time()):
            if len(self.queue) >= self.cap:
                self.dropped += 1
                continue
            self.queue.append(row)

    def hold(self, rec: Record, elapsed_s: float) -> Row:
        """The row `append` would queue, for a caller that commits it in a transaction of its own (`commit`): a
        batch's line, booked with its answer (gateway/batches/store.py). Until `release`, `read` counts it as
        waiting, as a queued row is."""
        held = pending(rec, elapsed_s, time.time(), self._null)
        row = take(deque([held]), self._prefix, self._ids).full()[0]
        self.held[row[0]] = held
        # A row the database refused would fail its line's booking, again at every try (the writer splits such a
        # row out: `_book`): the one value it refuses, a NUL in a text (PostgreSQL's), is replaced beforehand.
        return tuple(text(v) if isinstance(v, str) else v for v in row)

    def release(self, rows: Iterable[Row]) -> None:
        """Rows of `hold` committed (or never to be): no longer counted as waiting."""
        for row in rows:
            self.held.pop(row[0], None)

    # ------------------------------------------------------------------------------ the writer

    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run `fn(*args)` on the ledger's thread (every call but the writer's goes through it, one at a
        time); `LedgerDown` when the database does not answer within `timeout_ms` (and a margin)."""
        return await self._answer(asyncio.get_running_loop().run_in_executor(self._pool, fn, *args))

    async def change(self, body: Callable[[Cursor], Any]) -> Any:
        """`body` in one transaction of `call`'s connection, committed only while its caller still waits: past
        the wait (`LedgerDown`, a 503 for an admin call) it is rolled back, never made behind the caller's back (a
        key whose secret nobody was shown). Statements that each wait a while can add up past the wait.

        Its COMMIT is sent with `_COMMIT_S` of the wait left, and only the database knows when that ends: one
        that ends past the wait has made the change all the same. That is counted (`late_changes`) and logged,
        and the key poll applies it; a COMMIT that ended as the wait did answers as made rather than 503."""
        started = time.monotonic()
        deadline = started + self._wait_s - _COMMIT_S
        state = {"committed": False, "gave_up": False}
        lock = threading.Lock()

        def bounded(cur: Cursor) -> Any:
            out = body(cur)
            if time.monotonic() > deadline:
                raise LedgerDown(f"{self.db.where}: no answer within {self.cfg.timeout_ms} ms")
            return out

        def run() -> Any:
            out = self.db.transaction(bounded)
            with lock:
                state["committed"] = True
                late = state["gave_up"]
            if late:
                self.late_changes += 1
                log.error(
                    "ledger: a key change was committed %.1f s after its caller was answered 503 (its COMMIT took "
                    "longer than the wait); the key poll applies it (%d so far, gateway_ledger_late_changes)",
                    time.monotonic() - started - self._wait_s,
                    self.late_changes,
                )
            return out

        work = asyncio.get_running_loop().run_in_executor(self._pool, run)
        work.add_done_callback(lambda f: f.cancelled() or f.exception())  # an error after the 503: retrieved
        try:
            return await self._answer(asyncio.shield(work))
        except LedgerDown:
            with lock:
                state["gave_up"] = True
                made = state["committed"]
            if not made:
                raise
        self.unanswered = None
        return await work  # committed as the wait ended: its answer is a moment away

    def behind_writer(self, body: Callable[[Cursor], Any]) -> Coroutine[Any, Any, Any]:
        """`body` in a transaction of the writer's connection, handed to its thread in this very step, so that it
        runs after every batch the writer has taken from the queue so far is committed (or spilled), and before
        any it takes later: what a view adds of the queue's rows to what it reads is then never counted twice
        nor missed (gateway/ledger/report.py). Awaited as `call` is."""
        loop = asyncio.get_running_loop()
        return self._answer(loop.run_in_executor(self._writer_pool, self.rows.snapshot, body))

    async def read(self, body: Callable[[Cursor], Any]) -> tuple[Any, Rollups]:
        """What `body` reads of the committed rows, and the rollups of this process's rows still waiting for
        the writer (or held: `hold`): every row of this process counted once, whether committed or waiting; a
        held row committed a moment before its `release` is counted twice until the next read, never missed.

        The queue is copied and `body` handed to the writer's thread in the same step (nothing awaited in
        between): a row is either still in the copy, or in a batch the writer took before, whose commit that
        thread runs before `body`. (Asked on the thread of the other calls, `body` could run while the writer
        commits a batch taken before the copy, and miss its rows.) Rows other processes have not committed yet
        (at most their last `flush_ms`) show once they are."""
        copied = deque(self.queue)
        copied.extend(self.held.values())
        # The spill file's share is read on the writer's thread too, right after `body`: never a batch both
        # replayed (in what `body` reads) and still counted as spilled.
        # No await between the copy and this.
        asked = self.behind_writer(lambda cur: (body(cur), added(self.spilled, self.orphaned, 1)))
        waiting = rollups(take(copied, "", itertools.repeat(0)), fold=self.fold)
        out, spilled = await asked
        for k, v in spilled.items():
            sums = waiting.setdefault(k, [0, 0, 0, 0, 0, 0])
            for i, n in enumerate(v):
                sums[i] += n
        return out, waiting

    async def _answer(self, work: asyncio.Future[Any]) -> Any:
        try:
            async with asyncio.timeout(self._wait_s):
                out = await work
        except TimeoutError:
            self.unanswered = f"{self.db.where}: no answer within {self.cfg.timeout_ms} ms"
            raise LedgerDown(self.unanswered) from None
        except LedgerDown as exc:
            self.unanswered = str(exc)
            raise
        self.unanswered = None
        return out

    @property
    def trouble(self) -> str | None:
        """Why the ledger cannot be used now (the writer cannot write, or the last call had no answer)."""
        return self.down or self.unanswered

    async def _writing(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run `fn(*args)` on the writer's thread (its statements are bounded by the database's timeout)."""
        return await asyncio.get_running_loop().run_in_executor(self._writer_pool, fn, *args)

    async def start(self) -> None:
        # Not `call`: a migration waits as long as it must (another replica's, say).
        await asyncio.get_running_loop().run_in_executor(self._pool, self.db.migrate)
        self._wake = asyncio.Event()
        self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        assert self._wake is not None
        interval = self.cfg.flush_ms / 1000
        while not self._stopping:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval):
                    await self._wake.wait()
            self._wake.clear()
            try:
                await self.flush()
                if self.cfg.retention_days is not None and time.monotonic() >= self._retain_at:
                    self._retain_at = time.monotonic() + _RETAIN_EVERY_S
                    await self._writing(self._retain, self.cfg.retention_days)
            except Exception:  # the writer must outlive any one bad turn
                log.exception("ledger writer turn failed")

    async def flush(self) -> None:
        if self.dropped != self._dropped_logged:
            log.error(
                "ledger: the queue is full (ledger.queue_rows = %d): %d row(s) dropped so far",
                self.cap,
                self.dropped,
            )
            self._dropped_logged = self.dropped
        rows = take(self.queue, self._prefix, self._ids)
        # Asked every turn, so that the listing's own schedule holds even while every turn has rows to write.
        orphans = self._orphans_possible()
        # While the database is down, a turn with nothing to write asks it still (`_write`): an idle process would
        # otherwise report it down until the next request's row. Not at the last turn: it would only delay the exit.
        if rows.size or self.spill.waiting or orphans or (self.down is not None and not self._stopping):
            await self._writing(self._write, rows, orphans)

    def _orphans_possible(self) -> bool:
        """Whether another process's spill file may wait: looked for at the first turn, then every
        _ORPHANS_EVERY_S (a directory listing, which must not be paid every turn)."""
        now = time.monotonic()
        if self.down is not None or now < self._orphans_at:
            return False
        self._orphans_at = now + _ORPHANS_EVERY_S
        if self.spill.files():
            return True
        self.orphaned = {}  # the files it counted are gone (another process replayed them)
        return False

    def _write(self, rows: Batch, orphans: bool) -> None:
        """On the ledger's thread: spilled batches first (oldest first; another process's only when `orphans`
        says they may wait), then these rows; spill on failure."""
        refused, rejects_lost = self.refused, self.rejects.lost
        # Rows of days retention removes are not booked: their ids can no longer be looked up (retention may have
        # removed them once booked, by a replay interrupted part way), so booking them would count them twice in
        # the rollups; on PostgreSQL it would also make their day's partition again.
        kept_from = self._retained_from()
        # Per file; another process's counted once it is replayed whole (an interrupted one is read again).
        expired: dict[Path, int] = {}
        replayed = 0  # spilled rows booked this turn; none: the outage's end was found by new rows, or asked
        try:
            if self.down is not None and not rows.size and not self.spill.waiting:
                self.rows.probe()  # nothing of its own to commit would find out that the database answers again
            for path, batch in self.spill.batches(orphans):
                spilled = [tuple(r) for r in batch if r[3] >= kept_from]
                if spilled:
                    booked = functools.partial(commit, rows=spilled, db=self.rows, fold=self.fold)
                    self._book(booked, functools.partial(list, spilled))
                    replayed += len(spilled)
                if len(spilled) != len(batch):
                    expired[path] = expired.get(path, 0) + len(batch) - len(spilled)
                if path == self.spill.path:
                    # Booked: counted from now on as committed, not as spilled, even if the database goes away
                    # again before the rest of the file is replayed (and never replayed again).
                    self.spill.done += 1
                    self.spilled = added(self.spilled, self._spilled_parts.popleft(), -1)
            self.spill.replayed()
            if orphans:  # every file left by another process is booked (or is a live process's own)
                self.orphaned = {}
            if expired:
                self._expired(sum(expired.values()), kept_from)
            if self.spilled or self._spilled_parts:
                self.spilled = {}
                self._spilled_parts.clear()
            if rows.size:
                self._book(lambda cur: commit_batch(cur, rows, self.rows, self.fold), rows.full)
            if self.down is not None:
                said = f"{replayed} spilled row(s) replayed" if replayed else "no spilled row to replay"
                log.warning("ledger: %s answers again; %s", self.rows.where, said)
                self.down = None
            if self._lost_at is not None:
                log.error(
                    "ledger: %d row(s) lost during the outage (%s); %d so far",
                    self.spill.lost - self._lost_at,
                    self.spill.trouble,
                    self.spill.lost,
                )
                self._lost_at = None
        except LedgerDown as exc:
            if expired.get(self.spill.path):  # this file's batches booked are not read again
                self._expired(expired[self.spill.path], kept_from)
            if self.down is None:
                log.warning("ledger: cannot write (%s); rows go to %s until it answers", exc, self.spill.path)
            self.down = str(exc)
            if orphans:
                self._orphans_at = 0.0  # another process's file may be half replayed: look again once it answers
                if not self.orphaned:  # read once per outage: the directory is not listed again until it ends
                    self.orphaned = spilled_rollups(self.spill.left(), self.fold)
            # Rows of the batch already booked (split around a refused one) are booked once: replays skip
            # the ids the database holds.
            if rows.size and self.spill.write(rows.full()):
                part = rollups(rows, fold=self.fold)
                self._spilled_parts.append(part)
                self.spilled = added(self.spilled, part, 1)
            elif rows.size and self._lost_at is None:
                # Once per outage: every later turn of it would say the same (the count is in the metrics), and
                # the total is logged when the database answers again.
                self._lost_at = self.spill.lost - rows.size
                log.error(
                    "ledger: %s: rows are lost, and counted in gateway_ledger_spill_lost_rows, until the database "
                    "answers (%d so far)",
                    self.spill.trouble,
                    self.spill.lost,
                )
        if self.refused != refused:
            self._said_refused(self.refused - refused, self.rejects.lost - rejects_lost)

    def _said_refused(self, refused: int, lost: int) -> None:
        """One ERROR line per writer turn for the rows the database refused; one more when the refused-rows file
        first fails to keep them (its cause), and one when it keeps rows again (how many it lost meanwhile)."""
        if lost and self._rejects_lost_at is None:
            self._rejects_lost_at = self.rejects.lost - lost
            log.error(
                "ledger: %s: refused rows are lost, and counted in gateway_ledger_refused_lost_rows, until it takes "
                "rows again (%d so far)",
                self.rejects.trouble,
                self.rejects.lost,
            )
        where = f"kept in {self.rejects.path}" if refused > lost else "not kept (gateway_ledger_refused_lost_rows)"
        log.error(
            "ledger: the database refused %d row(s) (%s); %s, not booked (%d so far)",
            refused,
            self.refused_why,
            where,
            self.refused,
        )
        if refused > lost and self._rejects_lost_at is not None:
            log.error(
                "ledger: the refused-rows file takes rows again; %d refused row(s) lost while it could not (%s)",
                self.rejects.lost - self._rejects_lost_at,
                self.rejects.trouble,
            )
            self._rejects_lost_at = None

    def _book(self, body: Callable[[Cursor], int], rows: Callable[[], Sequence[Row]]) -> None:
        """Commit a batch; one the database refuses (a value it cannot store, not an outage) is split in
        halves, each its own transaction, down to the rows it refuses alone: those are kept aside and
        counted, and every other row is booked. Only `LedgerDown` (an outage) leaves here."""
        try:
            self.booked += self.rows.transaction(body)
        except LedgerDown:
            raise
        except Exception as exc:  # whatever a row's values make the driver or the server refuse
            self._split(list(rows()), exc)

    def _split(self, rows: list[Row], exc: Exception) -> None:
        if len(rows) == 1:
            self.refused += 1
            self.refused_why = why(exc)
            self.rejects.write(rows)
            return
        half = len(rows) // 2
        for part in (rows[:half], rows[half:]):
            try:
                self.booked += self.rows.transaction(functools.partial(commit, rows=part, db=self.rows, fold=self.fold))
            except LedgerDown:
                raise
            except Exception as again:
                self._split(part, again)

    def _retained_from(self) -> str:
        """The first day `retention_days` keeps ('' when it keeps every day)."""
        days = self.cfg.retention_days
        return "" if days is None else day_of(time.time() - (days - 1) * 86_400)

    def _expired(self, n: int, kept_from: str) -> None:
        self.expired += n
        log.warning(
            "ledger: %d spilled row(s) of days before %s (ledger.retention_days = %s) not booked at replay: "
            "retention removes such rows (%d so far, gateway_ledger_expired_rows)",
            n,
            kept_from,
            self.cfg.retention_days,
            self.expired,
        )

    def _retain(self, days: int) -> None:
        """On the ledger's thread: remove rows older than `days` days (today counts as one)."""
        before = day_of(time.time() - (days - 1) * 86_400)
        try:
            removed = self.rows.retain(before, _RETAIN_BATCH, _RETAIN_BATCHES)
        except LedgerDown:
            self._retain_at = 0.0  # try again at the next turn
            return
        if removed:
            what = "day partition(s)" if self.db.postgres else "row(s)"
            log.info("ledger: retention removed %d %s of days before %s", removed, what, before)
        if not self.db.postgres and removed >= _RETAIN_BATCH * _RETAIN_BATCHES:
            self._retain_at = 0.0  # more to remove: go on at the next turn

    async def close(self) -> None:
        """SIGTERM: stop the writer, then commit (or spill) every row still waiting."""
        self._stopping = True
        if self._wake is not None:
            self._wake.set()
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
        with contextlib.suppress(Exception):
            await self.flush()
        await self._writing(self.rows.close)
        self._writer_pool.shutdown(wait=True)
        with contextlib.suppress(LedgerDown):
            await self.call(self.db.close)
        # Not waiting: a call the database still holds ends at its statement timeout, on its own.
        self._pool.shutdown(wait=False, cancel_futures=True)
