"""A lean HTTP/1.1 client for the upstream hot path: keep-alive pools, llhttp parsing, flow control.

aiohttp's client spent about a fifth of a saturated worker's CPU per completion (request and header
objects, multidicts, tracing hooks, payload writers, a timer context per call). What a gateway needs
from a client is narrower: POST a body it has already encoded, read a status line, headers and a body
that is either buffered or relayed chunk by chunk, reuse connections, and time out. This module does
exactly that over asyncio protocols with httptools (the llhttp parser uvicorn uses), and nothing else:
no cookies, no redirects, no proxies (the aiohttp session it replaces trusted no proxy settings either),
no request compression. Responses in gzip or deflate are asked for and decoded, like aiohttp did.

Errors are four exception types, which `gateway.upstream` maps to the gateway's own: `ConnectFailed`
(nothing reached the server), `Disconnected` (the connection ended before a response began),
`Malformed` (a response began and then broke, or was not HTTP), and the built-in `TimeoutError`.
"""

from __future__ import annotations

import asyncio
import ssl
import time
import zlib
from collections import deque
from collections.abc import AsyncIterator, Mapping
from typing import Final, cast
from urllib.parse import urlsplit

import httptools

# A stream the client reads slower than the upstream writes pauses the socket above this many bytes.
_HIGH_WATER: Final = 1 << 20
_KEEPALIVE_S: Final = 30.0


class ConnectFailed(OSError):
    """The connection could not be opened."""


class Disconnected(ConnectionError):
    """The server closed or reset the connection before a response began."""


class Malformed(ConnectionError):
    """The response was cut short or was not valid HTTP/1.1."""


def _expire(fut: asyncio.Future[None]) -> None:
    # A plain timer per wait: asyncio.timeout's context manager cost about 3 % of a saturated worker.
    if not fut.done():
        fut.set_exception(TimeoutError())


class Origin:
    """Scheme, host and port of a base URL, with the request-line prefix parts it implies."""

    __slots__ = ("host", "port", "tls", "host_header")

    def __init__(self, scheme: str, host: str, port: int | None) -> None:
        self.tls = scheme == "https"
        self.host = host
        default = 443 if self.tls else 80
        self.port = port or default
        shown = f"[{host}]" if ":" in host else host
        self.host_header = shown if self.port == default else f"{shown}:{self.port}"


def split(url: str) -> tuple[tuple[str, str, int | None], str]:
    """(origin key, path with query) of an absolute http(s) URL, the path sent exactly as given."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConnectFailed(f"not an http(s) URL: {url!r}")
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return (parts.scheme, parts.hostname, parts.port), target


class Response:
    """Status and headers of an answer whose body arrives as the connection reads it."""

    __slots__ = (
        "status",
        "headers",
        "_conn",
        "_chunks",
        "_buffered",
        "_done",
        "_error",
        "_waiter",
        "_decoder",
        "_deadline",
        "_read_timeout",
        "_pausable",
    )

    def __init__(self, conn: _Connection, deadline: float, read_timeout: float) -> None:
        self.status = 0
        self.headers: dict[str, str] = {}
        self._conn: _Connection | None = conn
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._done = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._decoder: zlib._Decompress | None = None
        self._deadline = deadline
        self._read_timeout = read_timeout
        # Only a relayed stream may pause the socket: a buffered read() must take in the whole body.
        self._pausable = True

    # -- fed by the connection -----------------------------------------------------------------

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _feed(self, data: bytes) -> None:
        if self._decoder is not None:
            data = self._decoder.decompress(data)
            if not data:
                return
        self._chunks.append(data)
        self._buffered += len(data)
        if self._buffered > _HIGH_WATER and self._pausable and self._conn is not None:
            self._conn.pause()
        self._wake()

    def _finish(self) -> None:
        if self._decoder is not None:
            tail = self._decoder.flush()
            if tail:
                self._chunks.append(tail)
        self._done = True
        self._wake()

    def _fail(self, exc: BaseException) -> None:
        if not self._done:
            self._error = exc
            self._done = True
        self._wake()

    # -- read by the caller --------------------------------------------------------------------

    @property
    def at_eof(self) -> bool:
        return self._done and not self._chunks and self._error is None

    async def _wait(self) -> None:
        remaining = self._deadline - time.monotonic()
        timeout = min(self._read_timeout, remaining)
        if timeout <= 0:
            raise TimeoutError
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        timer = loop.call_later(timeout, _expire, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None

    async def read(self) -> bytes:
        self._pausable = False
        if self._conn is not None:
            self._conn.resume()
        while not self._done:
            await self._wait()
        if self._error is not None:
            raise self._error
        chunks, self._chunks = self._chunks, deque()
        self._buffered = 0
        self.release()
        return b"".join(chunks)

    async def iter_chunks(self) -> AsyncIterator[bytes]:
        while True:
            if self._chunks:
                chunk = self._chunks.popleft()
                self._buffered -= len(chunk)
                if self._conn is not None and self._buffered <= _HIGH_WATER // 2:
                    self._conn.resume()
                yield chunk
                continue
            if self._done:
                if self._error is not None:
                    raise self._error
                self.release()
                return
            await self._wait()

    def release(self) -> None:
        """Give the connection back: to the pool when the body was read whole, else closed."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.finished(reusable=self._done and self._error is None)


class _Connection(asyncio.Protocol):
    """One keep-alive connection carrying one exchange at a time."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.response: Response | None = None
        self.headers_ready: asyncio.Future[None] | None = None
        self.keep_alive = True
        self.lost = False
        self.paused = False
        self.idle_since = 0.0
        self._length_known = False

    # -- asyncio.Protocol ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self.response is None:
            self.close()  # bytes nobody asked for: this connection can no longer be trusted
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._broken(Malformed(f"invalid HTTP response: {exc}"))

    def eof_received(self) -> bool:
        return False  # let the transport close; connection_lost reports what it means

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        resp = self.response
        if resp is None:
            return
        headers_ready = self.headers_ready
        if headers_ready is not None and not headers_ready.done():
            headers_ready.set_exception(Disconnected("the server closed the connection before answering"))
        elif not self._length_known and not resp._done:
            # No Content-Length and not chunked: the body ends when the connection does (RFC 9112 6.3).
            resp._finish()
        else:
            resp._fail(Malformed("the response body was cut short"))

    # -- httptools callbacks -------------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        assert self.response is not None
        headers = self.response.headers
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        headers[key] = f"{headers[key]}, {text}" if key in headers else text

    def on_headers_complete(self) -> None:
        resp = self.response
        assert resp is not None
        resp.status = self.parser.get_status_code()
        self.keep_alive = self.parser.should_keep_alive()
        headers = resp.headers
        self._length_known = "content-length" in headers or "chunked" in headers.get("transfer-encoding", "")
        encoding = headers.get("content-encoding", "").strip().lower()
        if encoding in ("gzip", "x-gzip"):
            resp._decoder = zlib.decompressobj(16 + zlib.MAX_WBITS)
        elif encoding == "deflate":
            resp._decoder = zlib.decompressobj()
        if self.headers_ready is not None and not self.headers_ready.done():
            self.headers_ready.set_result(None)

    def on_body(self, body: bytes) -> None:
        if self.response is not None:
            try:
                self.response._feed(body)
            except zlib.error:
                self._broken(Malformed("the response body could not be decompressed"))

    def on_message_complete(self) -> None:
        if self.response is not None:
            self.response._finish()

    # -- used by the pool and the response -------------------------------------------------------

    def _broken(self, exc: BaseException) -> None:
        if self.headers_ready is not None and not self.headers_ready.done():
            self.headers_ready.set_exception(exc)
        if self.response is not None:
            self.response._fail(exc)
        self.close()

    def pause(self) -> None:
        if not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.paused and self.transport is not None and not self.lost:
            self.paused = False
            self.transport.resume_reading()

    def close(self) -> None:
        self.keep_alive = False
        if self.transport is not None:
            self.transport.abort()

    def finished(self, reusable: bool) -> None:
        self.response = None
        self.headers_ready = None
        if reusable and self.keep_alive and not self.lost:
            self.resume()
            self.pool.put_back(self)
        else:
            self.close()
            self.pool.forget()

    async def exchange(self, request: bytes, first_byte_s: float, deadline: float) -> Response:
        resp = Response(self, deadline, first_byte_s)
        self.response = resp
        loop = asyncio.get_running_loop()
        self.headers_ready = loop.create_future()
        assert self.transport is not None
        self.transport.write(request)
        timeout = min(first_byte_s, deadline - time.monotonic())
        timer = loop.call_later(max(timeout, 0.0), _expire, self.headers_ready)
        try:
            await self.headers_ready
        except BaseException:
            resp._conn = None
            self.finished(reusable=False)
            raise
        finally:
            timer.cancel()
        return resp


class Pool:
    """Keep-alive connections to one origin, at most `limit` open at once (the rest wait their turn)."""

    def __init__(self, origin: Origin, limit: int, tls: ssl.SSLContext | None) -> None:
        self.origin = origin
        self.limit = limit
        self.tls = tls
        self.idle: deque[_Connection] = deque()
        self.open = 0
        self.waiters: deque[asyncio.Future[None]] = deque()
        self.closed = False

    def put_back(self, conn: _Connection) -> None:
        if self.closed:
            conn.close()
            self.forget()
            return
        conn.idle_since = time.monotonic()
        self.idle.append(conn)
        self._wake_one()

    def forget(self) -> None:
        self.open -= 1
        self._wake_one()

    def _wake_one(self) -> None:
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def _reusable(self) -> _Connection | None:
        now = time.monotonic()
        while self.idle:
            conn = self.idle.pop()  # the most recently used: the least likely to have been closed by the server
            if not conn.lost and now - conn.idle_since < _KEEPALIVE_S:
                return conn
            conn.close()
            self.open -= 1
        return None

    async def _connection(self, connect_s: float, deadline: float) -> tuple[_Connection, bool]:
        """A pooled connection (True) or a new one (False), waiting for a free slot within the deadline."""
        while True:
            conn = self._reusable()
            if conn is not None:
                return conn, True
            if self.open < self.limit:
                break
            waiter = asyncio.get_running_loop().create_future()
            self.waiters.append(waiter)
            try:
                async with asyncio.timeout(max(deadline - time.monotonic(), 0)):
                    await waiter
            except BaseException:
                if waiter.done() and not waiter.cancelled():
                    self._wake_one()  # the slot this waiter was handed goes to the next one
                waiter.cancel()
                raise
        self.open += 1
        try:
            return await self._connect(connect_s, deadline), False
        except BaseException:
            self.forget()
            raise

    async def _connect(self, connect_s: float, deadline: float) -> _Connection:
        loop = asyncio.get_running_loop()
        origin = self.origin
        timeout = min(connect_s, deadline - time.monotonic())
        if timeout <= 0:
            raise TimeoutError
        try:
            async with asyncio.timeout(timeout):
                _, conn = await loop.create_connection(
                    lambda: _Connection(self),
                    origin.host,
                    origin.port,
                    ssl=self.tls,
                    server_hostname=origin.host if self.tls is not None else None,
                )
        except TimeoutError:
            raise
        except OSError as exc:
            raise ConnectFailed(str(exc)) from None
        return conn

    async def request(self, request: bytes, connect_s: float, first_byte_s: float, total_s: float) -> Response:
        deadline = time.monotonic() + total_s
        # No resend here, even on a pooled connection that turns out closed: the server may have read the
        # request, and a completion is not idempotent. The failover loop decides (it retries Disconnected).
        conn, _ = await self._connection(connect_s, deadline)
        return await conn.exchange(request, first_byte_s, deadline)

    def close(self) -> None:
        self.closed = True
        while self.idle:
            self.idle.pop().close()
            self.open -= 1


class Client:
    """Pools per origin for one provider, and the bytes of each request."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.pools: dict[tuple[str, str, int | None], Pool] = {}
        self._tls: ssl.SSLContext | None = None

    def _pool(self, key: tuple[str, str, int | None]) -> Pool:
        pool = self.pools.get(key)
        if pool is None:
            origin = Origin(*key)
            if origin.tls and self._tls is None:
                self._tls = ssl.create_default_context()
            pool = self.pools[key] = Pool(origin, self.limit, self._tls if origin.tls else None)
        return pool

    async def request(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str],
        body: bytes,
        *,
        connect_s: float,
        first_byte_s: float,
        total_s: float,
    ) -> Response:
        key, target = split(url)
        pool = self._pool(key)
        lines = [f"{method} {target} HTTP/1.1\r\nhost: {pool.origin.host_header}\r\ncontent-length: {len(body)}\r\n"]
        compression = True
        for name, value in headers.items():
            lowered = name.lower()
            if lowered in ("host", "content-length", "transfer-encoding", "connection"):
                continue
            if lowered == "accept-encoding":
                compression = False
            if "\r" in value or "\n" in value or "\r" in name or "\n" in name:
                raise ValueError(f"header {name!r} contains a line break")
            lines.append(f"{name}: {value}\r\n")
        if compression:
            # Hosted APIs compress large answers when asked (the recorded OpenAI body was gzip); the saving
            # on the wire outweighs the decoding here.
            lines.append("accept-encoding: gzip, deflate\r\n")
        lines.append("\r\n")
        head = "".join(lines).encode("latin-1")
        return await pool.request(head + body, connect_s, first_byte_s, total_s)

    def close(self) -> None:
        for pool in self.pools.values():
            pool.close()
        self.pools.clear()
