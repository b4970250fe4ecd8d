"""The rate-limit script's own Redis connection: pipelined, batched per event-loop tick, self-repairing.

The calls of one tick leave in one write, and those that may be (a `Part`) as one script call of the
script's `batch` mode, which decides each as if it ran alone and answers each on its own.

It costs a third of redis-py's CPU per call with the same batching (`python -m bench.redis_channel`),
and is set up by redis-py's own connection class from the same parsed URL, so the two cannot disagree
about an option. It owns NOSCRIPT reloads, Cluster MOVED/ASK and Sentinel re-discovery: docs/ratelimits.md.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any, Final, NamedTuple, cast

import hiredis

from gateway.grace import Grace
from gateway.state import Deadline, Degraded, SharedState

# Error replies after which the script has not run and the node is not (or no longer) the right one.
_NOT_MASTER: Final = (b"READONLY", b"MASTERDOWN", b"CLUSTERDOWN", b"TRYAGAIN", b"LOADING")


class ChannelError(Exception):
    """The connection failed or was lost; the caller treats Redis as down."""


class ScriptError(Exception):
    """Redis answered a command with an error reply (for example NOSCRIPT after a restart)."""


class Unanswered(Degraded):
    """The call reached Redis's socket but no answer came back: Redis may run it yet, or may have run it."""


def bulk(value: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(value), value)


def command(*parts: bytes) -> bytes:
    return b"*%d\r\n" % len(parts) + b"".join(bulk(p) for p in parts)


def _redirect(error: ScriptError) -> tuple[str, tuple[str, int]] | None:
    """`MOVED <slot> <host>:<port>` or `ASK ...` as (kind, address); None for any other error."""
    parts = str(error).split()
    if len(parts) != 3 or parts[0] not in ("MOVED", "ASK"):
        return None
    host, _, port = parts[2].rpartition(":")
    return parts[0], (host.strip("[]"), int(port))


# What waits for a command's reply: one caller, or (a merged call) one per part, in order.
_Target = asyncio.Future[Any] | list[asyncio.Future[Any]]
_Batch = list[tuple[bytes, _Target]]
# A channel's command on the wire: its bytes (to send again after an error reply), who waits for its reply,
# and, on a write's last command, the loop time by which that reply must have come (else the watchdog drops
# the connection).
_Call = tuple[bytes, _Target, float | None]


class _Protocol(asyncio.Protocol):
    """The socket's replies, in order, to what waits for them: a future (a raw `submit`), or a channel's
    call, handed to `on_reply` as its reply is read (no future per command, no callback scheduled per
    reply); `on_lost` gets the calls still due when the connection goes."""

    def __init__(
        self,
        address: tuple[str, int] | None,
        on_reply: Callable[[_Protocol, _Call, Any], None] | None = None,
        on_lost: Callable[[_Protocol, list[_Call]], None] | None = None,
    ) -> None:
        self.address = address
        self.reader = hiredis.Reader(replyError=ScriptError)
        self.waiting: deque[asyncio.Future[Any] | _Call] = deque()
        self.transport: asyncio.Transport | None = None
        self.lost = False
        self.retired = False  # no new commands: closed once the replies still due have come back
        self.streams: tuple[object, object] | None = None
        self.on_reply = on_reply
        self.on_lost = on_lost
        # Armed while a write's reply is due (`ScriptChannel._watch`); a `Grace` while one past it is looked for.
        self.watchdog: asyncio.Handle | Grace | None = None
        self.looked = 0.0  # the deadline last given one more read of the socket before the drop

    def data_received(self, data: bytes) -> None:
        reader = self.reader
        reader.feed(data)
        waiting = self.waiting
        while (reply := reader.gets()) is not False:
            if not waiting:
                break  # a reply nobody waits for cannot happen on a FIFO connection; never crash on it
            item = waiting.popleft()
            if isinstance(item, tuple):
                assert self.on_reply is not None
                self.on_reply(self, item, reply)
            elif not item.done():
                item.set_result(reply)
        if self.retired and not waiting:
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        waiting, self.waiting = self.waiting, deque()
        calls: list[_Call] = []
        for item in waiting:
            if isinstance(item, tuple):
                calls.append(item)
            elif not item.done():
                item.set_exception(ChannelError("redis connection lost"))
        if self.on_lost is not None:
            self.on_lost(self, calls)

    def retire(self) -> None:
        self.retired = True
        if not self.waiting:
            self.close()

    def close(self) -> None:
        self.lost = True
        if self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        self.lost = True
        if self.transport is not None:
            self.transport.abort()

    def submit(self, commands: list[bytes]) -> list[asyncio.Future[Any]]:
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[Any]] = [loop.create_future() for _ in commands]
        self.waiting.extend(futures)
        assert self.transport is not None
        self.transport.write(b"".join(commands))
        return futures

    def send(self, calls: list[_Call], data: bytes) -> None:
        """`calls` written as `data` (their commands, in order): each one's reply goes to `on_reply`."""
        self.waiting.extend(calls)
        assert self.transport is not None
        self.transport.write(data)


# Calls merged into one script call (`Part`s) per write, at most: the script runs them one after
# another while Redis serves nothing else, so a burst is cut into calls of this many.
PARTS_PER_CALL: Final = 64
_BATCH: Final = bulk(b"batch")


class Part(NamedTuple):
    """One script call that may share a script call with others queued in the same tick: `keys` its
    `nkeys` keys as RESP bulk strings, `args` its 2 + 4 * nkeys arguments (mode, lease, per bucket kind,
    limit, period, cost), and `single` the command's head when it goes alone (through the key count)."""

    single: bytes
    keys: bytes
    nkeys: int
    args: bytes

    def command(self) -> bytes:
        return self.single + self.keys + self.args


_EVALSHA: Final = bulk(b"EVALSHA")
# A part's key count as the batch's arguments carry it, for the counts calls have (a set's few buckets).
_COUNTS: Final = tuple(bulk(b"%d" % n) for n in range(16))


def _merged(sha: bytes, parts: list[Part]) -> bytes:
    """`parts` as one call of the script's `batch` mode: every part's keys, then every part's arguments."""
    keys: list[bytes] = []
    args: list[bytes] = [_BATCH]
    nkeys = 0
    for p in parts:  # one loop: it runs for every merged call, on up to PARTS_PER_CALL parts
        n = p.nkeys
        nkeys += n
        keys.append(p.keys)
        args.append(_COUNTS[n] if n < 16 else bulk(b"%d" % n))
        args.append(p.args)
    # EVALSHA, sha, numkeys, the keys, "batch", then per part its count, mode, lease and 4 per bucket.
    head = b"*%d\r\n" % (4 + nkeys + 3 * len(parts) + 4 * nkeys)
    return b"".join([head, _EVALSHA, bulk(sha), bulk(b"%d" % nkeys), *keys, *args])


def _answer(target: _Target, result: Any) -> None:
    """A reply to its caller, or a merged call's replies to theirs (a caller that went away is skipped)."""
    if isinstance(target, list):
        if type(result) is not list or len(result) != len(target):
            _raise(target, Degraded)  # not the batch's answer: never pair a reply with the wrong caller
            return
        for fut, one in zip(target, result, strict=True):
            if not fut.done():
                fut.set_result(one)
    elif not target.done():
        target.set_result(result)


def _raise(target: _Target, kind: type[Degraded]) -> None:
    for fut in target if isinstance(target, list) else (target,):
        if not fut.done():
            fut.set_exception(kind())


def _pending(target: _Target) -> bool:
    return any(not f.done() for f in target) if isinstance(target, list) else not target.done()


class ScriptChannel:
    """One connection for one script's calls; `call` queues a command for this tick's write.

    `route_key` is a key every call names (all of a call's keys share its hash slot): on a cluster the
    channel talks to that slot's master.
    """

    def __init__(self, shared: SharedState, script: str, route_key: str) -> None:
        assert shared.parsed is not None, "a channel needs a redis.url"
        self._shared = shared
        self._script = script.encode()
        self.sha = hashlib.sha1(self._script).hexdigest().encode()
        self._route_key = route_key
        self._deadline_s = shared.timeout_s * 2
        self._address: tuple[str, int] | None = None  # the node to use (cluster, sentinel); None: resolve
        self._protocol: _Protocol | None = None
        self._connecting: asyncio.Future[_Protocol] | None = None
        self._queue: list[tuple[bytes | Part, asyncio.Future[Any]]] = []
        self._sending: set[asyncio.Task[None]] = set()
        self._closed = False
        # Whether the caller is the only request in flight (`Limiter.solo`): then no other call can join
        # this tick's write, and waiting for the tick's end would only cost a lone request a loop turn.
        self.alone: Callable[[], bool] | None = None
        # Told when the connection in use drops, or its node is no longer the master: Redis may have lost state.
        self.dropped: Callable[[], None] = lambda: None

    # ---------------------------------------------------------------------------------------- connection

    async def _open(self, address: tuple[str, int] | None) -> _Protocol:
        parsed = self._shared.parsed
        assert parsed is not None
        # No CLIENT SETINFO (the library's name and version): a reconnect, which happens while Redis is
        # failing, costs only what the URL asks for (AUTH, SELECT, CLIENT SETNAME). The caller's `Deadline`
        # bounds the set-up.
        host, port = address if address is not None else (None, None)
        conn = parsed.deadline_connection(host, port, driver_info=None)
        # redis-py sets the connection up (TLS, AUTH, SELECT, CLIENT SETNAME): every option of the URL is
        # applied by the same code as the pool's. Then the socket is ours.
        try:
            await conn.connect()  # type: ignore[no-untyped-call]
        except BaseException:
            # Cancelled (the connect deadline) or refused half-way: redis-py leaves the socket open.
            if conn._writer is not None:
                conn._writer.transport.abort()
            conn._reader = conn._writer = None
            raise
        reader, writer = conn._reader, conn._writer
        assert reader is not None and writer is not None
        conn._reader = conn._writer = None  # so that redis-py never closes the transport it handed over
        proto = _Protocol(address, self._reply, self._lost)
        # Held for the connection's life: a StreamWriter that is collected closes its transport.
        proto.streams = (reader, writer)
        transport = cast(asyncio.Transport, writer.transport)
        transport.set_protocol(proto)
        proto.transport = transport
        leftover = bytes(getattr(reader, "_buffer", b""))  # nothing is due after the set-up; never lose a byte
        if leftover:
            proto.data_received(leftover)
        return proto

    async def _resolve_and_open(self) -> _Protocol:
        async with Deadline(self._deadline_s):
            address = self._address
            if address is None and self._shared.parsed is not None and self._shared.parsed.mode != "node":
                address = self._address = await self._shared.master_address(self._route_key)
            return await self._open(address)

    async def _connected(self) -> _Protocol:
        proto = self._protocol
        if proto is not None and not proto.lost:
            return proto
        if self._connecting is None:
            self._connecting = asyncio.ensure_future(self._resolve_and_open())
        connecting = self._connecting
        try:
            proto = await asyncio.shield(connecting)
        except Exception as exc:  # OSError, TimeoutError, RedisError (AUTH refused, no master known, ...)
            self._address = None
            raise ChannelError(f"redis unreachable: {type(exc).__name__}") from None
        finally:
            if self._connecting is connecting and connecting.done():
                self._connecting = None
        self._protocol = proto
        return proto

    @property
    def connected(self) -> bool:
        return self._protocol is not None and not self._protocol.lost

    def _move(self, address: tuple[str, int] | None) -> None:
        """Use another node from the next write on: replies still due on this connection still arrive."""
        self._address = address
        proto, self._protocol = self._protocol, None
        if proto is not None:
            proto.retire()

    def abort(self) -> None:
        """Drop the connection: after a timeout the replies still due would pair with later commands."""
        proto, self._protocol = self._protocol, None
        if proto is not None:
            proto.abort()

    async def close(self) -> None:
        self._closed = True  # calls queued from now on fail at once: no connection is opened after this
        if self._sending:
            await asyncio.gather(*self._sending, return_exceptions=True)
        connecting = self._connecting
        if connecting is not None:
            await asyncio.gather(connecting, return_exceptions=True)
            if not connecting.cancelled() and connecting.exception() is None:
                connecting.result().abort()
        self.abort()

    # ---------------------------------------------------------------------------------------- calls

    def call(self, cmd: bytes | Part) -> asyncio.Future[Any]:
        """Queue one command (or a `Part`, which may share a script call with the tick's others:
        `_send_queued`) for this tick's write: sent at once when it is alone (nothing can join it), else at
        the tick's end. The future fails with Degraded when the call was not sent (or Redis refused it
        unrun), and with Unanswered when it was sent but no answer came in time."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        self._queue.append((cmd, fut))
        if len(self._queue) == 1:
            alone = self.alone
            if alone is not None and alone():
                self._send_queued()
            else:
                loop.call_soon(self._send_queued)
        return fut

    def _send_queued(self) -> None:
        """Every call queued in one loop tick goes to Redis in one write: one round trip for all the
        requests that arrived together. The parts among them go as one script call (up to PARTS_PER_CALL
        in each), which decides each in turn exactly as if it ran alone, and answers each on its own."""
        queued, self._queue = self._queue, []
        batch: _Batch = []
        if len(queued) == 1:  # one call this tick (a lone request): it goes as it is
            one, fut = queued[0]
            batch.append((one if isinstance(one, bytes) else one.command(), fut))
        else:
            parts: list[Part] = []
            waiting: list[asyncio.Future[Any]] = []
            for cmd, fut in queued:
                if isinstance(cmd, bytes):
                    batch.append((cmd, fut))
                else:
                    parts.append(cmd)
                    waiting.append(fut)
            if len(parts) == 1:
                batch.append((parts[0].command(), waiting[0]))
            else:
                for i in range(0, len(parts), PARTS_PER_CALL):
                    batch.append((_merged(self.sha, parts[i : i + PARTS_PER_CALL]), waiting[i : i + PARTS_PER_CALL]))
        if self._closed:
            self._fail(None, batch, ChannelError("closed"), sent=False)
            return
        proto = self._protocol
        if proto is not None and not proto.lost:
            self._write(proto, batch)  # the common case costs no task
        else:
            self._spawn(self._connect_and_send(batch))

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(work)
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _connect_and_send(self, batch: _Batch) -> None:
        try:
            proto = await self._connected()
        except ChannelError as exc:
            self._fail(None, batch, exc, sent=False)
            return
        self._write(proto, batch)

    def _write(self, proto: _Protocol, batch: _Batch) -> None:
        # A reply that never comes: drop the connection, which fails every reply still due (and keeps
        # late replies from pairing with the next batch's commands). The write's deadline rides on its last
        # command (replies come back in order); one watchdog per connection enforces the oldest one due,
        # where a timer per write cost a timer's start and cancel on every round trip.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._deadline_s
        calls: list[_Call] = [(cmd, target, None) for cmd, target in batch]
        cmd, target = batch[-1]
        calls[-1] = (cmd, target, deadline)
        proto.send(calls, b"".join([cmd for cmd, _ in batch]) if len(batch) > 1 else cmd)
        if proto.watchdog is None:
            proto.watchdog = loop.call_at(deadline, self._watch, proto)

    def _watch(self, proto: _Protocol) -> None:
        """The watchdog: drop the connection when its oldest write still unanswered is past its deadline;
        else wait for that write's deadline (none due: the next write arms it again)."""
        proto.watchdog = None
        if proto.lost:
            return
        for item in proto.waiting:
            if isinstance(item, tuple) and item[2] is not None:  # the oldest write's last command
                deadline = item[2]
                loop = asyncio.get_running_loop()
                if deadline > loop.time():
                    proto.watchdog = loop.call_at(deadline, self._watch, proto)
                elif proto.looked != deadline:
                    # The reply may be here already, late only in being read (gateway/grace.py): look again
                    # after the loop's next read of its sockets.
                    proto.looked = deadline
                    proto.watchdog = Grace(loop, self._watch, proto)
                else:
                    proto.abort()
                return

    def _reply(self, proto: _Protocol, call: _Call, reply: Any) -> None:
        """A call's reply, as the protocol reads it: to its caller, or (an error reply) handled here."""
        cmd, target, _ = call
        if isinstance(reply, ScriptError):
            if _pending(target):  # else the caller was cancelled: `acquire` cancels its lease
                self._refused(proto, cmd, target, reply)
        else:
            _answer(target, reply)

    def _lost(self, proto: _Protocol, calls: list[_Call]) -> None:
        """The connection went, with `calls` still unanswered (a timeout aborted it, or Redis went away)."""
        if proto.watchdog is not None:
            proto.watchdog.cancel()
            proto.watchdog = None
        if proto is self._protocol and not self._closed:  # not a one-off's, nor a retired node's
            self.dropped()
        if calls:
            self._fail(proto, [(c, t) for c, t, _ in calls], ChannelError("redis connection lost"), sent=True)

    def _refused(self, proto: _Protocol, cmd: bytes, fut: _Target, error: ScriptError) -> None:
        """An error reply: none of these ran the script, so resending is safe."""
        text = str(error).encode()
        redirect = _redirect(error)
        if text.startswith(b"NOSCRIPT"):
            self._spawn(self._resend(fut, [command(b"SCRIPT", b"LOAD", self._script), cmd], None))
        elif redirect is not None and redirect[0] == "MOVED":
            # The slot has a new master (a failover, a resharding): it is the node from now on.
            if self._protocol is proto:
                self._move(redirect[1])
            self._spawn(self._resend(fut, [cmd], None))
        elif redirect is not None:
            # ASK: the slot is migrating and this call's keys are new or gone: ask the target, once (it
            # may not know the script yet; ASKING covers the next command only).
            load = command(b"SCRIPT", b"LOAD", self._script)
            self._spawn(self._resend(fut, [load, command(b"ASKING"), cmd], redirect[1]))
        elif text.startswith(_NOT_MASTER):
            # Sentinel promoted another node, or the cluster is failing over: find the master again.
            if self._protocol is proto:
                self._move(None)
                self.dropped()  # the new master may lack the last writes
            self._shared.mark_down(error)
            _raise(fut, Degraded)
        else:
            _raise(fut, Degraded)

    async def _resend(self, fut: _Target, commands: list[bytes], elsewhere: tuple[str, int] | None) -> None:
        """Send `commands` (the last is the call) on the channel, or on a one-off connection to `elsewhere`."""
        result: Any = None
        try:
            async with Deadline(self._deadline_s):
                if elsewhere is None:
                    result = await (await self._connected()).submit(commands)[-1]
                else:
                    one_off = await self._open(elsewhere)
                    try:
                        result = await one_off.submit(commands)[-1]
                    finally:
                        one_off.close()
        except Exception as exc:  # no answer (the write may have reached Redis) or no connection
            if elsewhere is None:
                self._fail(None, [], exc, sent=True)
            result = None
        if result is None:
            _raise(fut, Unanswered)
        elif isinstance(result, ScriptError):
            _raise(fut, Degraded)  # refused again (it did not run): no second resend
        else:
            _answer(fut, result)

    def _fail(self, proto: _Protocol | None, batch: _Batch, exc: BaseException, *, sent: bool) -> None:
        # Dropping the connection does not take back what was written: Redis reads and runs it when it
        # can, even after the close (a stalled Redis runs it when it resumes). Hence Unanswered.
        if proto is None or proto is self._protocol:
            self.abort()
            self._address = None  # a lost node may be a failed master: ask again who the master is
        self._shared.mark_down(exc)
        for _cmd, target in batch:
            _raise(target, Unanswered if sent else Degraded)
