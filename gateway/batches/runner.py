"""The runner: a background task of every gateway process that runs the batches whose lease it holds.

Every `batches.poll_ms` it claims batches with work left whose lease is free (new ones, and those of a
process that died: a lease not renewed for `batches.lease_ms`), at most `_MAX_BATCHES` at once, and drives
each: validate its file into lines (the lease renewed while it parses), then send lines (at most
`batches.concurrency` in flight over the process), book their answers (and ledger rows) in small transactions,
renew the lease with every write, and end it as completed, failed (a budget exhausted), expired (its `completion_window`
over) or cancelled. A line is marked `sent` before it is sent and booked once answered: a line booked is
never sent again, and a line in flight when its process died is sent once more by whoever takes the batch
over. A line the gateway had no room for (a queue timed out or was full, a rate limit) is sent again after a
backoff while its batch's window lasts, holding its place in `batches.concurrency` as it waits, so a
saturated server slows the batch down instead of filling memory with lines waiting to retry.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import random
import time
from collections.abc import Callable
from typing import Final

from prometheus_client import Counter, Gauge

from gateway.batches import checking, leases, store
from gateway.batches.objects import ACTIVE, ERR, LATER, OK, TERMINAL, BatchError, Booked, answered, unanswered
from gateway.batches.send import ENDED, Sent, send
from gateway.config import BatchesConfig
from gateway.ids import unique_suffix
from gateway.ledger.batch import same
from gateway.ledger.engine import LedgerDown
from gateway.limits.auth import team_undeclared
from gateway.limits.usage import ANONYMOUS
from gateway.ops.metrics import Metrics
from gateway.path.dialects import OPENAI
from gateway.path.pipeline import Pipeline
from wire.errors import GatewayError
from wire.schema import encode

log = logging.getLogger("gateway")

_MAX_BATCHES: Final = 4  # batches one process drives at once (their lines share `batches.concurrency`)
_FLUSH_S: Final = 0.05  # answers are booked at least this often (and whenever a turn has some)
_PAUSE_S: Final = 0.5  # a batch whose database does not answer tries again this often
_RETAIN_EVERY_S: Final = 3600
_RETAIN_LIMIT: Final = 1000
# A line sent again later waits this long after its first refusal, doubling with each one up to the most
# (a refusal's Retry-After, when longer, is waited instead); less a random part, so lines refused together
# do not all come back at once.
_BACKOFF_S: Final = 1.0
_BACKOFF_MAX_S: Final = 60.0
_ENDED: Final = {
    "expired": ("batch_expired", "This request could not be executed before the completion window expired."),
    "cancelled": ("batch_cancelled", "This request was not executed: the batch was cancelled."),
    "failed": ("batch_failed", "This request was not executed: the batch failed."),
}


class BatchMetrics:
    def __init__(self, metrics: Metrics) -> None:
        r = metrics.registry
        self.lines = Counter("gateway_batch_lines", "Batch lines ended, by how", ["status"], registry=r)
        self.batches = Gauge(
            "gateway_batches", "Batches in the ledger, by status", ["status"], registry=r, multiprocess_mode="max"
        )
        self.in_flight = Gauge(
            "gateway_batch_lines_in_flight",
            "Batch lines being sent by this process",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.requeued = Counter(
            "gateway_batch_lines_requeued",
            "Batch lines the gateway had no room for, put back to be sent again after a backoff, by why",
            ["code"],
            registry=r,
        )


class Runner:
    def __init__(self, db: store.Store, current: Callable[[], Pipeline], metrics: Metrics | None) -> None:
        self.store = db
        self.current = current
        self.metrics = metrics
        self.counted = BatchMetrics(metrics) if metrics is not None else None
        self.me = leases.owner_name()
        self.in_flight = 0
        self.deferred = 0  # lines waiting to be sent again: they hold their place in `batches.concurrency`
        self.slots = asyncio.Event()  # set when a line ends: a driver waiting for room looks again
        self.taking = asyncio.Lock()  # held by the batch taking lines (`Drive._lines`)
        self.driving: dict[str, asyncio.Task[None]] = {}
        self.drives: dict[str, Drive] = {}  # the batches driven here whose key is known
        self.wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._stop_at = 0.0  # the loop's time of the stop signal (or of `close`): the grace counts from it
        self._retain_at = 0.0
        self._down_logged = False

    @property
    def cfg(self) -> BatchesConfig:
        """`batches.*` of the config serving now: a reload applies to the batches running too."""
        return self.current().loaded.config.batches

    @property
    def lease_s(self) -> float:
        return self.cfg.lease_ms / 1000

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._loop())

    def poke(self) -> None:
        """A batch was made (or cancelled) here: look now instead of at the next poll."""
        self.wake.set()

    async def _loop(self) -> None:
        while not self._stopping:
            try:
                await self._turn()
                self._down_logged = False
            except LedgerDown as exc:
                if not self._down_logged:
                    log.warning("batches: the ledger's database does not answer (%s); retrying", exc)
                    self._down_logged = True
            except Exception:  # the runner must outlive any one bad turn
                log.exception("batch runner turn failed")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.cfg.poll_ms / 1000):
                    await self.wake.wait()
            self.wake.clear()

    async def _turn(self) -> None:
        for batch_id, task in list(self.driving.items()):
            if task.done():
                del self.driving[batch_id]
        driven = self._driven()
        while len(self.driving) < _MAX_BATCHES:
            claimed = await self.store.run(leases.claim, self.me, self.lease_s, list(self.driving), driven)
            if claimed is None:
                break
            self.driving[claimed] = asyncio.ensure_future(self._drive(claimed))
        if len(self.driving) >= _MAX_BATCHES and max(driven.values(), default=0) > 1:
            await self._make_room()
        if self.counted is not None:
            found = await self.store.run(store.counts)
            for status in (*ACTIVE, *TERMINAL):
                self.counted.batches.labels(status).set(found.get(status, 0))
        if time.monotonic() >= self._retain_at:
            self._retain_at = time.monotonic() + _RETAIN_EVERY_S
            gone = await self.store.run(store.retain, time.time() - self.cfg.retain_days * 86_400, _RETAIN_LIMIT)
            if gone:
                log.info("batches: retention deleted %d batch(es) and file(s)", gone)
                if gone >= _RETAIN_LIMIT:
                    self._retain_at = 0.0  # more to delete: at the next turn

    def _driven(self) -> dict[str, int]:
        """How many batches of each key this process drives (those still running)."""
        out: dict[str, int] = {}
        for drive in self.drives.values():
            if not drive.yielding:
                out[drive.owner] = out.get(drive.owner, 0) + 1
        return out

    async def _make_room(self) -> None:
        """Every slot taken while another key's batch waits: the key with the most batches here hands its
        newest back, once its lines in flight have ended (none sent again), and the next turn takes the
        waiting one. A key alone keeps every slot."""
        waiting = await self.store.run(leases.waiting_keys, self.me)
        driven = self._driven()  # as it is now, after the awaits above
        if not waiting - driven.keys() or max(driven.values(), default=0) < 2:
            return
        most = max(driven, key=lambda k: driven[k])
        newest = [d for d in self.drives.values() if d.owner == most and not d.yielding][-1]
        newest.yielding = True
        log.info("batches: %s hands its slot to another key's batch waiting; it resumes later", newest.id)

    async def _drive(self, batch_id: str) -> None:
        try:
            await Drive(self, batch_id).run()
        except leases.LostLease:
            log.warning("batches: %s was taken over by another process (its lease ran out here)", batch_id)
        except LedgerDown as exc:
            log.warning("batches: %s paused, the ledger's database does not answer (%s)", batch_id, exc)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await self.store.run(leases.release, batch_id, self.me)
            raise
        except Exception:
            log.exception("batches: running %s failed; it resumes when its lease runs out", batch_id)

    def ended(self, status: str, n: int = 1) -> None:
        if self.counted is not None and n:
            self.counted.lines.labels(status).inc(n)

    @property
    def stopping(self) -> bool:
        return self._stopping

    def drain(self) -> None:
        """The stop signal (gateway/ops/stopsignal.py): no line is claimed or sent from now on, while the server
        drains its requests; the lines in flight have until `server.shutdown_grace_ms` after it (`close`)."""
        if not self._stopping:
            self._stopping = True
            self._stop_at = time.monotonic()
            self.wake.set()

    async def close(self) -> None:
        """Shutdown: stop claiming and sending lines (if the stop signal has not already); the lines in flight
        have what is left of `server.shutdown_grace_ms` since the signal to be answered and booked, then every
        batch is handed back (those still in flight are cut, and sent again by the next runner)."""
        self.drain()
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
        if self.driving:
            grace = self.current().loaded.config.server.shutdown_grace_ms / 1000
            left = max(grace - (time.monotonic() - self._stop_at), 0.0)
            await asyncio.wait(self.driving.values(), timeout=left)
        for task in self.driving.values():
            task.cancel()
        await asyncio.gather(*self.driving.values(), return_exceptions=True)


class Drive:
    """One batch, run by this process while it holds the lease."""

    def __init__(self, runner: Runner, batch_id: str) -> None:
        self.runner = runner
        self.id = batch_id
        # -> the line: idx, custom_id, body (None: over `caps.request_body_bytes`, not read: `store.take`)
        self.tasks: dict[asyncio.Task[Sent], tuple[int, str, str | None]] = {}
        self.done: list[Booked] = []
        self.stop: str | None = None  # why the batch fails (a budget exhausted)
        self.later: list[tuple[float, int, str, str | None]] = []  # lines to send again: (when, idx, custom_id, body)
        self.refusals: dict[int, int] = {}  # idx -> how many times in a row the line was put back
        self.owner = ""  # the key that made the batch
        self.endpoint = ""  # what its lines ask for: a key of `send.ENDPOINTS`
        self.yielding = False  # handing its slot to another key's batch: no new lines, then the lease back

    async def run(self) -> None:
        r = self.runner
        try:
            status, expires_at, _, endpoint, owner, _ = await r.store.run(store.state, self.id, r.me, r.lease_s)
            self.owner = str(owner)
            self.endpoint = str(endpoint)
            r.drives[self.id] = self
            if status == "validating" and time.time() < expires_at:  # else it ends as expired, unchecked
                await self._validate()
            await self._lines(owner)
        except asyncio.CancelledError:
            # A stop past its grace: answers that came already are booked, so only the lines still in flight are
            # sent again.
            with contextlib.suppress(Exception):
                await self._collect(wait=False)
                await self._flush()
            raise
        finally:
            r.drives.pop(self.id, None)
            for task in self.tasks:
                task.cancel()
            if self.tasks:
                await asyncio.gather(*self.tasks, return_exceptions=True)
                r.in_flight -= len(self.tasks)
                self._gauge()
            # Answers not booked (their lines are sent again): their ledger rows are not the ledger's either.
            unbooked = [t.result().booked(0) for t in self.tasks if not t.cancelled() and t.exception() is None]
            self._release([*self.done, *unbooked])
            self.done.clear()
            # Still `sent` in the database: whoever runs the batch next sends them again.
            r.deferred -= len(self.later)
            self.later.clear()

    def _due(self) -> list[tuple[int, str, str | None]]:
        """The lines put back whose wait is over, taken out of the runner's deferred count."""
        now = time.monotonic()
        due = []
        while self.later and self.later[0][0] <= now:
            _, idx, custom_id, body = heapq.heappop(self.later)
            due.append((idx, custom_id, body))
        self.runner.deferred -= len(due)
        return due

    def _defer(self, idx: int, custom_id: str, body: str | None, sent: Sent) -> None:
        """Send the line again after a backoff (it stays `sent` in the database meanwhile)."""
        refusals = self.refusals[idx] = self.refusals.get(idx, 0) + 1
        wait = min(_BACKOFF_S * 2 ** (refusals - 1), _BACKOFF_MAX_S) * random.uniform(0.5, 1.0)
        wait = max(wait, sent.retry_after or 0.0)
        heapq.heappush(self.later, (time.monotonic() + wait, idx, custom_id, body))
        self.runner.deferred += 1
        if self.runner.counted is not None:
            self.runner.counted.requeued.labels(sent.code or "").inc()

    def _gauge(self) -> None:
        if self.runner.counted is not None:
            self.runner.counted.in_flight.set(self.runner.in_flight)

    async def _validate(self) -> None:
        r = self.runner
        found = await r.store.run(store.to_validate, self.id, r.me, r.lease_s)
        if found is None:
            return
        cfg = r.cfg
        max_line = r.current().loaded.config.caps.request_body_bytes
        try:
            await checking.check(r.store, self.id, r.me, r.lease_s, *found, cfg.max_lines, cfg.max_file_bytes, max_line)
        except (leases.LostLease, LedgerDown):
            raise
        except Exception:
            # A file this cannot read or store would be read again at every lease, and the batch would stay
            # `validating` for good: it fails instead, saying so.
            log.exception("batches: the input file of %s could not be checked; the batch fails", self.id)
            error = BatchError("invalid_file", "The input file could not be read as a batch's lines", None, None)
            await store.validated(r.store, self.id, r.me, r.lease_s, [], [error])

    async def _lines(self, owner: str) -> None:
        r = self.runner
        paused = False
        while True:
            try:
                leaving = self.yielding or r.stopping  # no new lines, then the lease back
                # One batch takes at a time, and counts the lines it took in flight before its next await: batches
                # never exceed `batches.concurrency` together. Taking at once, each with its room reserved, a batch
                # with only lines put back (nothing to take) held the room the other's take needed, and two
                # batches polling in step could keep the other at none for as long as their turns stayed aligned.
                async with r.taking:
                    room = (
                        max(r.cfg.concurrency - r.in_flight - r.deferred, 0) if self.stop is None and not leaving else 0
                    )
                    max_body = r.current().loaded.config.caps.request_body_bytes
                    held, lines, waiting = await r.store.run(store.take, self.id, r.me, r.lease_s, room, max_body)
                status, expires_at = held[0], held[1]
                if status in TERMINAL:
                    return
                ended = None
                if status == "cancelling":
                    ended = "cancelled"
                elif time.time() >= expires_at:
                    ended = "expired"
                elif self.stop is not None:
                    ended = "failed"
                elif status == "finalizing" or (waiting == 0 and not self.tasks and not self.done):
                    await self._flush()
                    await r.store.run(store.finish, self.id, r.me, r.lease_s, "completed", [])
                    return
                if ended is not None:
                    await self._end(ended)
                    return
                if leaving and not self.tasks:
                    await self._flush()
                    r.deferred -= len(self.later)  # put back lines are sent again by whoever takes the batch next
                    self.later.clear()
                    await r.store.run(leases.release, self.id, r.me)
                    return
                pipeline = r.current()
                # A batch made on an open gateway runs keyless only while the gateway is still open.
                key = pipeline.keys.identified(owner)
                # A runtime key whose team the config in force does not declare: its lines are refused as its
                # requests are, and those left run once a reload declares the team again.
                stray = pipeline.keys.stray(owner) if key is None else None
                keyless = owner == ANONYMOUS and key is None and pipeline.keys.open
                owning = key or stray
                expired = owning is not None and owning.valid_until is not None and owning.valid_until <= time.time()
                started = 0
                for idx, custom_id, body in [*self._due(), *lines]:
                    if stray is not None and not expired:
                        sent = _refused(custom_id, team_undeclared(stray))
                        self.done.append(sent.booked(idx))
                        continue
                    if (key is None and not keyless) or expired:
                        sent = _gone(custom_id, expired)
                        self.done.append(sent.booked(idx))
                        continue
                    raw = None if body is None else body.encode()
                    task = asyncio.ensure_future(send(pipeline, r.metrics, key, self.id, custom_id, raw, self.endpoint))
                    self.tasks[task] = (idx, custom_id, body)
                    started += 1
                r.in_flight += started
                self._gauge()
                await self._collect()
                await self._flush()
            except LedgerDown as exc:
                # The database away (restarting, failing over): the lines in flight are kept and their answers
                # booked once it is back. Ending the drive here would cut them, and whoever ran the batch next
                # would send each again; a lease that ran out meanwhile is found lost at the next write.
                if not paused:
                    log.warning("batches: %s paused, the ledger's database does not answer (%s)", self.id, exc)
                paused = True
                await asyncio.sleep(_PAUSE_S)
                continue
            paused = False

    async def _collect(self, wait: bool = True) -> None:
        """Wait for a line to end (or a short while), and take every answer there is."""
        r = self.runner
        if not wait:
            pass
        elif self.tasks:
            await asyncio.wait(list(self.tasks), timeout=_FLUSH_S * 4, return_when=asyncio.FIRST_COMPLETED)
        else:
            r.slots.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_FLUSH_S * 4):
                    await r.slots.wait()
        finished = [t for t in self.tasks if t.done()]
        for task in finished:
            idx, custom_id, body = self.tasks.pop(task)
            sent = task.result()
            if sent.state == LATER:
                self._defer(idx, custom_id, body, sent)
                continue
            self.refusals.pop(idx, None)
            if sent.stop is not None and self.stop is None:
                self.stop = sent.stop
            self.done.append(sent.booked(idx))
        if finished:
            r.in_flight -= len(finished)
            r.slots.set()
            self._gauge()

    async def _flush(self) -> None:
        if not self.done:
            return
        r = self.runner
        done, self.done = self.done, []
        try:
            ledger = r.current().ledger
            fold = same if ledger is None else ledger.fold
            await r.store.run(store.record, self.id, r.me, r.lease_s, done, r.store.db, fold)
        except LedgerDown:
            # Booked at the next try, once the database is back (a line already booked is not booked twice).
            self.done = done + self.done
            raise
        except BaseException:
            self._release(done)  # not committed: the lines are sent again, and their rows are nobody's
            raise
        self._release(done)  # committed with their lines
        r.ended("completed", sum(1 for d in done if d[1] == OK))
        r.ended("failed", sum(1 for d in done if d[1] == ERR))

    def _release(self, done: list[Booked]) -> None:
        ledger = self.runner.current().ledger
        if ledger is not None:
            ledger.release(d[4] for d in done if d[4] is not None)

    async def _end(self, status: str) -> None:
        """Cancelled, expired or failed: stop the lines in flight, book what was answered, close the rest."""
        r = self.runner
        for task in self.tasks:
            task.cancel(ENDED)  # never sent again: each is booked as cut off (499)
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for task, (idx, _, _) in self.tasks.items():
            if not task.cancelled() and task.exception() is None:
                sent = task.result()
                if sent.state != LATER:
                    self.done.append(sent.booked(idx))
        r.in_flight -= len(self.tasks)
        self.tasks.clear()
        r.deferred -= len(self.later)
        self.later.clear()  # the lines put back are closed with the rest of those not answered
        self._gauge()
        await self._flush()
        # Lines stored part-way (the batch cancelled meanwhile) never became the batch's: closing them would
        # answer lines that were never to run, so it ends with none, as a batch cancelled before its check.
        await store.unstore_all(r.store, self.id, r.me, r.lease_s)
        left = await r.store.run(store.left, self.id)
        code, message = _ENDED[status]
        if status == "failed" and self.stop is not None:
            message = f"This request was not executed: the batch failed ({self.stop})."
        closed = [(idx, unanswered("batch_req_" + unique_suffix(), cid, code, message).decode()) for idx, cid in left]
        await r.store.run(store.finish, self.id, r.me, r.lease_s, status, closed, self.stop)
        r.ended(status, len(closed))


def _refused(custom_id: str, exc: GatewayError) -> Sent:
    """A line refused before it is sent, with the error an interactive request of its key gets."""
    line_id = "batch_req_" + unique_suffix()
    status, body = OPENAI.error(exc)
    return Sent(ERR, answered(line_id, custom_id, status, line_id, body))


def _gone(custom_id: str, expired: bool) -> Sent:
    """The line of a batch whose key is not in force: the 401 an interactive request of that key gets."""
    line_id = "batch_req_" + unique_suffix()
    message = (
        "The API key that made this batch has expired"
        if expired
        else "The API key that made this batch is no longer in force (revoked, removed, or its name now a key "
        "of the gateway's config)"
    )
    body = encode(
        {"error": {"message": message, "type": "authentication_error", "param": None, "code": "invalid_api_key"}}
    )
    return Sent(ERR, answered(line_id, custom_id, 401, line_id, body))
