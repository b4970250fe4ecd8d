"""A pipelined Redis connection for the rate-limit script, the one Redis call on the request path.

redis-py's asyncio client costs a saturated worker more than the script itself: a pipeline object,
argument encoding in Python, a task per `wait_for` and a timeout context per reply, for every call.
Here a request's call is a few cached byte strings joined into one RESP command, every command of
one event-loop tick leaves in a single write, and replies (parsed in C by hiredis) resolve the
waiting futures in order. Nothing else uses this connection, so the FIFO pairing of commands and
replies is all the bookkeeping it needs.

Everything that is not the script (health, usage, the status page) stays on redis-py through
`SharedState`; the connection settings (host, port, db, credentials, TLS, unix socket) come from the
same URL, parsed by redis-py, so the two never disagree.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from typing import Any, Final, cast

import hiredis
from redis.asyncio.connection import SSLConnection, UnixDomainSocketConnection, parse_url

_CONNECT_S: Final = 0.25


class ChannelError(Exception):
    """The connection failed or was lost; the caller treats Redis as down."""


class ScriptError(Exception):
    """Redis answered a command with an error reply (for example NOSCRIPT after a restart)."""


def bulk(value: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(value), value)


def command(*parts: bytes) -> bytes:
    return b"*%d\r\n" % len(parts) + b"".join(bulk(p) for p in parts)


class _Protocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.reader = hiredis.Reader(replyError=ScriptError)
        self.waiting: deque[asyncio.Future[Any]] = deque()
        self.transport: asyncio.Transport | None = None
        self.lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        reader = self.reader
        reader.feed(data)
        waiting = self.waiting
        while (reply := reader.gets()) is not False:
            if not waiting:
                break  # a reply nobody waits for cannot happen on a FIFO connection; never crash on it
            fut = waiting.popleft()
            if not fut.done():
                fut.set_result(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        waiting, self.waiting = self.waiting, deque()
        for fut in waiting:
            if not fut.done():
                fut.set_exception(ChannelError("redis connection lost"))


class ScriptChannel:
    """One TCP (or unix, or TLS) connection to Redis, opened on first use and again after a loss."""

    def __init__(self, url: str) -> None:
        self._kwargs: dict[str, Any] = dict(parse_url(url))
        self._protocol: _Protocol | None = None
        self._connecting: asyncio.Future[_Protocol] | None = None

    async def _open(self) -> _Protocol:
        loop = asyncio.get_running_loop()
        kw = self._kwargs
        cls = kw.get("connection_class")
        if cls is UnixDomainSocketConnection:
            _, proto = await loop.create_unix_connection(_Protocol, kw["path"])
        else:
            tls = ssl.create_default_context() if cls is SSLConnection else None
            _, proto = await loop.create_connection(
                _Protocol, kw.get("host", "localhost"), int(kw.get("port", 6379)), ssl=tls
            )
        hello: list[bytes] = []
        if kw.get("password"):
            user = kw.get("username")
            creds = [user.encode()] if user else []
            hello.append(command(b"AUTH", *creds, str(kw["password"]).encode()))
        if int(kw.get("db", 0) or 0):
            hello.append(command(b"SELECT", str(kw["db"]).encode()))
        if hello:
            answers = self._submit(proto, hello)
            for answer in await asyncio.gather(*answers):
                if isinstance(answer, ScriptError):
                    proto.transport.close() if proto.transport else None
                    raise ChannelError(f"redis refused the connection set-up: {answer}")
        return proto

    async def _connected(self) -> _Protocol:
        proto = self._protocol
        if proto is not None and not proto.lost:
            return proto
        if self._connecting is None:
            self._connecting = asyncio.ensure_future(asyncio.wait_for(self._open(), _CONNECT_S))
        connecting = self._connecting
        try:
            proto = await asyncio.shield(connecting)
        except (OSError, TimeoutError, ChannelError) as exc:
            raise ChannelError(f"redis unreachable: {type(exc).__name__}") from None
        finally:
            if self._connecting is connecting and connecting.done():
                self._connecting = None
        self._protocol = proto
        return proto

    @property
    def connected(self) -> bool:
        return self._protocol is not None and not self._protocol.lost

    def submit(self, commands: list[bytes]) -> list[asyncio.Future[Any]]:
        """`send` on a connection known to be open (`connected`): no await, no task."""
        assert self._protocol is not None
        return self._submit(self._protocol, commands)

    @staticmethod
    def _submit(proto: _Protocol, commands: list[bytes]) -> list[asyncio.Future[Any]]:
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[Any]] = [loop.create_future() for _ in commands]
        proto.waiting.extend(futures)
        assert proto.transport is not None
        proto.transport.write(b"".join(commands))
        return futures

    async def send(self, commands: list[bytes]) -> list[asyncio.Future[Any]]:
        """Write every command at once; each future resolves to its reply (a ScriptError on an error reply)."""
        proto = self._protocol
        if proto is None or proto.lost:
            proto = await self._connected()
        return self._submit(proto, commands)

    def abort(self) -> None:
        """Drop the connection: after a timeout the replies still due would pair with later commands."""
        proto, self._protocol = self._protocol, None
        if proto is not None and proto.transport is not None:
            proto.transport.abort()

    def close(self) -> None:
        self.abort()
