"""Response parsing for the h1 client: the status and headers of an answer, and its body as the
connection reads it, buffered with flow control, decoded and capped.
"""

from __future__ import annotations

import asyncio
import time
import zlib
from collections import deque
from collections.abc import AsyncGenerator
from typing import Final, Protocol

from gateway.upstream.h1body import _INFLATE_STEP, _Inflate
from gateway.upstream.h1wire import (
    _HIGH_WATER,
    FAILURES,
    MAX_BODY,
    Failed,
    Malformed,
    Spent,
    TooLarge,
    Watchdog,
    _body_too_large,
)

# An answer whose content ended (its end-of-stream event came) before its body did: how long its connection
# waits for the rest of the body (the chunked framing's last chunk, as a rule already on its way) to be given
# back to the pool, and how many bytes of it are taken, before it is closed instead.
SETTLE_S: Final = 1.0
SETTLE_BYTES: Final = 65_536


class Carrier(Protocol):
    """What an answer needs of the connection that reads it (`h1connection._Connection`)."""

    paused: bool  # reading is paused (`pause`) until `resume`
    response: Response | None  # the answer the connection's bytes are read into

    @property
    def pool(self) -> Holder: ...

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    def close(self) -> None: ...

    def finished(self, *, reusable: bool) -> None: ...

    watchdog: Watchdog


class Holder(Protocol):
    """The pool a connection comes from (`h1.Pool`), as far as a settled answer needs it."""

    settling: set[Carrier]


class Response:
    """Status and headers of an answer whose body arrives as the connection reads it."""

    __slots__ = (
        "status",
        "headers",
        "_conn",
        "_watchdog",
        "_chunks",
        "_buffered",
        "_done",
        "_error",
        "_waiter",
        "_decoder",
        "_deadline",
        "_read_timeout",
        "_pausable",
        "_max_body",
        "last_wait",
    )

    def __init__(self, conn: Carrier, deadline: float, read_timeout: float, max_body: int = MAX_BODY) -> None:
        self.status = 0
        self.headers: dict[str, str] = {}
        self._conn: Carrier | None = conn
        # The connection's watchdog times every wait, also one begun after the connection was let go.
        self._watchdog = conn.watchdog
        # Body bytes as received (still compressed, if they are): decoding is the reader's work, so a
        # bomb expands only as far as the reader asks.
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._done = False
        self._error: BaseException | type[Spent] | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._decoder: _Inflate | None = None
        self._deadline = deadline
        self._read_timeout = read_timeout
        # Only a relayed stream may pause the socket: a buffered read() must take in the whole body.
        self._pausable = True
        self._max_body = max_body
        self.last_wait = 0.0  # `Reply.last_wait`

    # -- fed by the connection -----------------------------------------------------------------

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _feed(self, data: bytes) -> None:
        self._chunks.append(data)
        self._buffered += len(data)
        if self._buffered > _HIGH_WATER and self._pausable and self._conn is not None:
            self._conn.pause()
        # `_wake`, inlined: this runs for every piece of every body.
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _finish(self) -> None:
        self._done = True
        self._wake()

    def _fail(self, exc: BaseException) -> None:
        if not self._done:
            self._error = exc
            self._done = True
        self._wake()

    def _abort(self, exc: BaseException) -> BaseException:
        """Fail the answer from the reader's side and close its connection; returns `exc` to raise."""
        self._done = True
        self._error = exc
        self._chunks.clear()
        self._buffered = 0
        self.release()
        return exc

    # -- read by the caller --------------------------------------------------------------------

    @property
    def at_eof(self) -> bool:
        return self._done and not self._chunks and self._error is None

    async def _wait(self) -> None:
        now = self.last_wait = time.monotonic()
        remaining = self._deadline - now
        timeout = min(self._read_timeout, remaining)
        if timeout <= 0:
            raise TimeoutError("total_timeout")
        cause = "read_timeout" if self._read_timeout < remaining else "total_timeout"
        watchdog = self._watchdog
        waiter = self._waiter = watchdog.loop.create_future()
        watchdog.watch(waiter, timeout, cause)
        try:
            await waiter
        finally:
            self._waiter = None
            del waiter  # failed, it holds the exception, whose traceback holds this frame: no cycle back

    async def _turn(self) -> None:
        if time.monotonic() >= self._deadline:
            raise TimeoutError("total_timeout")
        await asyncio.sleep(0)

    async def read(self) -> bytes:
        """The whole body, decoded; `TooLarge` past `max_body` decoded bytes (the connection is closed)."""
        self._pausable = False
        if self._conn is not None:
            self._conn.resume()
        cap = self._max_body
        decoder = self._decoder
        if decoder is None and self._done and self._error is None:
            # The common case, a plain body that came in with the headers: no loop, no decoding.
            chunks = self._chunks
            body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
            if len(body) > cap:
                raise self._abort(_body_too_large(cap))
            chunks.clear()
            self._buffered = 0
            self.release()
            return body
        if decoder is None and not self._done:
            length = self.headers.get("content-length")
            # llhttp has checked it is one run of digits.
            if length is not None and int(length) > cap:
                raise self._abort(_body_too_large(cap))
        parts: list[bytes] = []
        size = 0
        chunks = self._chunks
        while True:
            while chunks:
                chunk = chunks.popleft()
                self._buffered -= len(chunk)
                if decoder is not None:
                    try:
                        # One byte over the cap is enough to know the body is too large.
                        chunk, _ = decoder.decode(chunk, cap - size + 1)
                    except zlib.error:
                        raise self._abort(Malformed("the response body could not be decompressed")) from None
                size += len(chunk)
                if size > cap:
                    raise self._abort(_body_too_large(cap))
                parts.append(chunk)
            if self._done:
                break
            await self._wait()
        if self._error is not None:
            raise self._error
        if decoder is not None:
            try:
                tail = decoder.flush()
            except zlib.error:
                raise self._abort(Malformed("the response body could not be decompressed")) from None
            size += len(tail)
            if size > cap:
                raise self._abort(_body_too_large(cap))
            parts.append(tail)
        self.release()
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def iter_chunks(self, failed: Failed | None = None) -> AsyncGenerator[bytes, None]:
        """The body as it arrives; a failure (`FAILURES`) raises `failed(exc)` in its place when given: the
        caller's mapping, made here rather than by a generator around this one that every chunk would pass."""
        decoder = self._decoder
        chunks = self._chunks
        given = 0  # bytes handed out since the reader last waited for the socket
        try:
            while True:
                if chunks:
                    if given >= _INFLATE_STEP:
                        # More is at hand without a wait (a bomb's rest, or a fast upstream read by a slow client):
                        # other requests get the loop first, and the deadline holds as it does at a wait.
                        given = 0
                        await self._turn()
                        continue
                    chunk = chunks.popleft()
                    self._buffered -= len(chunk)
                    if decoder is not None:
                        try:
                            chunk, rest = decoder.decode(chunk, _INFLATE_STEP)
                        except zlib.error:
                            raise self._abort(Malformed("the response body could not be decompressed")) from None
                    elif len(chunk) > _INFLATE_STEP:
                        # A socket read may be larger: handed out whole, the deadline would be looked at again
                        # only once a slow client had taken all of it.
                        chunk, rest = chunk[:_INFLATE_STEP], chunk[_INFLATE_STEP:]
                    else:
                        rest = b""
                    if rest:
                        chunks.appendleft(rest)
                        self._buffered += len(rest)
                    conn = self._conn
                    if conn is not None and conn.paused and self._buffered <= _HIGH_WATER // 2:
                        conn.resume()
                    if chunk:
                        given += len(chunk)
                        yield chunk
                    continue
                if self._done:
                    if self._error is not None:
                        raise self._error
                    tail = b""
                    if decoder is not None:
                        try:
                            tail = decoder.flush()
                        except zlib.error:
                            raise self._abort(Malformed("the response body could not be decompressed")) from None
                    self.release()
                    if tail:
                        yield tail
                    return
                given = 0
                await self._wait()
        except FAILURES as exc:
            if failed is None:
                raise
            raise failed(exc) from None

    def settle(self) -> None:
        """The answer's content ended (its end-of-stream event came): nothing more of it is read. Its connection
        goes back to the pool once the rest of the body arrives, within `SETTLE_S` and `SETTLE_BYTES`, else it
        is closed; the reader does not wait for either (an upstream holding the stream open after its end holds
        no client)."""
        conn = self._conn
        if conn is None or self._done:
            self.release()
            return
        self._conn = None
        self._chunks.clear()
        self._buffered = 0
        conn.response = _Settling(conn)
        conn.resume()

    def release(self) -> None:
        """Give the connection back: to the pool when the body was read whole, else closed."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.finished(reusable=self._done and self._error is None)
        if self._error is not None:
            # Raised, the error's traceback holds the frames that read this answer, and so this answer: let go
            # of the error once its reader is done with it, or the two would be a cycle left to the collector.
            self._error = Spent


class _Settling(Response):
    """The rest of a settled answer's body, read and dropped until it ends (the connection is pooled) or until
    `SETTLE_S` or `SETTLE_BYTES` run out (it is closed)."""

    __slots__ = ("_timer",)

    def __init__(self, conn: Carrier) -> None:
        super().__init__(conn, 0.0, 0.0)
        self._timer = conn.watchdog.loop.call_later(SETTLE_S, self._fail, TimeoutError("settle"))
        conn.pool.settling.add(conn)

    def _feed(self, data: bytes) -> None:
        self._buffered += len(data)
        if self._buffered > SETTLE_BYTES:
            self._fail(TooLarge("more body after the answer's end than its framing"))

    def _finish(self) -> None:
        self._end(reusable=True)

    def _fail(self, exc: BaseException) -> None:
        self._end(reusable=False)

    def _end(self, *, reusable: bool) -> None:
        self._done = True
        self._timer.cancel()
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.pool.settling.discard(conn)
            conn.finished(reusable=reusable)
