"""A lean HTTP/1.1 client for the upstream hot path: keep-alive pools, llhttp parsing, flow control.

aiohttp's client cost about a fifth of a saturated worker's CPU; this does only what a gateway needs
(POST an encoded body, read a buffered or relayed answer, reuse connections, time out). A connection goes
back to the pool only when its answer was read cleanly to the end, everything an upstream sends is
bounded, and failures carry their cause. Details: docs/security.md.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections import deque
from collections.abc import Coroutine, Mapping
from typing import Any

from gateway.upstream.h1connection import _Connection
from gateway.upstream.h1response import Carrier, Response
from gateway.upstream.h1wire import (
    _KEEPALIVE_S,
    FAILURES,
    MAX_BODY,
    MAX_HEADER_BYTES,
    MAX_HEADERS,
    MAX_INTERIM,
    ConnectFailed,
    Disconnected,
    Malformed,
    Origin,
    TooLarge,
    connect_cause,
    header_lines,
    hop_by_hop,
    request_line,
    split,
)

# The h1 client's public names, wherever they are defined (the callers say `h1.Malformed`, `h1.Response`).
__all__ = [
    "FAILURES",
    "MAX_BODY",
    "MAX_HEADER_BYTES",
    "MAX_HEADERS",
    "MAX_INTERIM",
    "Client",
    "ConnectFailed",
    "Disconnected",
    "Malformed",
    "Origin",
    "Pool",
    "Response",
    "TooLarge",
    "connect_cause",
    "hop_by_hop",
    "split",
]


class Pool:
    """Keep-alive connections to one origin, at most `limit` open at once (the rest wait their turn)."""

    def __init__(
        self,
        origin: Origin,
        limit: int,
        tls: ssl.SSLContext | None,
        *,
        max_body: int = MAX_BODY,
        max_header_bytes: int = MAX_HEADER_BYTES,
        max_headers: int = MAX_HEADERS,
        max_interim: int = MAX_INTERIM,
    ) -> None:
        self.origin = origin
        self.limit = limit
        self.tls = tls
        self.max_body = max_body
        self.max_header_bytes = max_header_bytes
        self.max_headers = max_headers
        self.max_interim = max_interim
        self.idle: deque[_Connection] = deque()
        self.open = 0
        self.waiters: deque[asyncio.Future[None]] = deque()
        self.closed = False
        # Connections taking the rest of a settled answer's body (`Response.settle`): closed with the pool.
        self.settling: set[Carrier] = set()

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
            transport = conn.transport
            if (
                not conn.lost
                and transport is not None
                and not transport.is_closing()
                and now - conn.idle_since < _KEEPALIVE_S
            ):
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
            except BaseException as exc:
                if waiter.done() and not waiter.cancelled():
                    self._wake_one()  # the slot this waiter was handed goes to the next one
                waiter.cancel()
                if isinstance(exc, TimeoutError):
                    raise TimeoutError("pool_timeout") from None
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
        remaining = deadline - time.monotonic()
        timeout = min(connect_s, remaining)
        if timeout <= 0:
            raise TimeoutError("total_timeout")
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
            raise TimeoutError("connect_timeout" if connect_s < remaining else "total_timeout") from None
        except OSError as exc:
            raise ConnectFailed(str(exc), cause=connect_cause(exc)) from None
        return conn

    async def request(self, request: bytes, connect_s: float, first_byte_s: float, total_s: float) -> Response:
        deadline = time.monotonic() + total_s
        # No resend here, even on a pooled connection that turns out closed: the server may have read the
        # request, and a completion is not idempotent. The failover loop decides (it retries Disconnected).
        # An idle connection at once, as nearly every request finds one: no coroutine of its own to wait in.
        conn = self._reusable()
        if conn is None:
            conn, _ = await self._connection(connect_s, deadline)
        return await conn.exchange(request, first_byte_s, deadline, self.max_body)

    def close(self) -> None:
        self.closed = True
        while self.idle:
            self.idle.pop().close()
            self.open -= 1
        for conn in list(self.settling):
            conn.close()  # its answer fails, and hands it back (`finished`), which forgets it


class Client:
    """Pools per origin for one provider, and the bytes of each request.

    The caps default to the config's defaults; the gateway passes `caps.upstream_body_bytes` as
    `max_body`, `caps.upstream_header_bytes` as `max_header_bytes` and `caps.upstream_interim_answers` as
    `max_interim`.
    """

    def __init__(
        self,
        limit: int,
        *,
        max_body: int = MAX_BODY,
        max_header_bytes: int = MAX_HEADER_BYTES,
        max_headers: int = MAX_HEADERS,
        max_interim: int = MAX_INTERIM,
    ) -> None:
        self.limit = limit
        self.max_body = max_body
        self.max_header_bytes = max_header_bytes
        self.max_headers = max_headers
        self.max_interim = max_interim
        self.pools: dict[tuple[str, str, int | None], Pool] = {}
        self._tls: ssl.SSLContext | None = None

    def _pool(self, key: tuple[str, str, int | None]) -> Pool:
        pool = self.pools.get(key)
        if pool is None:
            origin = Origin(*key)
            if origin.tls and self._tls is None:
                self._tls = ssl.create_default_context()
            pool = self.pools[key] = Pool(
                origin,
                self.limit,
                self._tls if origin.tls else None,
                max_body=self.max_body,
                max_header_bytes=self.max_header_bytes,
                max_headers=self.max_headers,
                max_interim=self.max_interim,
            )
        return pool

    def request(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str],
        body: bytes,
        *,
        connect_s: float,
        first_byte_s: float,
        total_s: float,
    ) -> Coroutine[Any, Any, Response]:
        """The exchange's coroutine (the pool's own, not one awaiting it: a frame less on every resume). A bad
        method, URL or header is raised here, when it is called."""
        if method in ("HEAD", "CONNECT"):
            # A HEAD answer's Content-Length frames no body and CONNECT ends HTTP: llhttp cannot be told.
            raise ValueError(f"method {method} is not supported")
        key, line = request_line(method, url)
        pool = self.pools.get(key) or self._pool(key)
        head = f"{line}host: {pool.origin.host_header}\r\ncontent-length: {len(body)}\r\n{header_lines(headers)}"
        return pool.request(head.encode("latin-1") + body, connect_s, first_byte_s, total_s)

    def close(self) -> None:
        for pool in self.pools.values():
            pool.close()
        self.pools.clear()
