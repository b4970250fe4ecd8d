"""The network under the engine-metrics reads: every byte a replica sends is charged to the read it answers.

A read runs on httpcore, whose HTTP/1.1 parser (h11) spends Python steps on every interim `1xx` answer and
every chunk of a chunked body before any of it reaches gateway/fleet/exposition.py: counting only the body
would let a replica keep the gateway busy with bytes that carry none. Counted off the socket, the status
line, the headers, the interim answers, the chunk framing and the body all count against the read's
`metrics_max_bytes`; the head against `MAX_HEAD` too, read `HEAD_STEP` bytes at a time so that the loop
serves requests between the steps of a flood of interim answers. A short piece of body is charged up to
`MIN_PIECE`: 1-byte chunks cost 1 KiB each.

Which read a byte belongs to is the task's: each replica is read by a task of its own (gateway/fleet/engine.py),
httpcore reads a connection only in the task of the request on it, and `METER` is set for the read.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterable
from contextvars import ContextVar
from typing import Any, ClassVar, Final

import httpcore
import httpx

from gateway.fleet.exposition import Unreadable

# The most a read's head may take: status lines and headers of the answer and of every interim answer before it.
MAX_HEAD: Final = 64 * 1024
# The most one socket read takes while the head is read (a whole head of a real replica is a few hundred bytes).
HEAD_STEP: Final = 4 * 1024
# A piece of body (a chunk, or what one socket read brought) is charged as at least this many bytes.
MIN_PIECE: Final = 1024
# An idle connection to a replica is kept this long for its next read.
_KEEPALIVE_S: Final = 5.0


class Meter:
    """What one read has taken from its replica, against its caps. Raises Unreadable past one."""

    __slots__ = ("cap", "head", "taken")

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.taken = 0
        self.head = True  # until the final answer's head is read

    def charge(self, n: int) -> None:
        self.taken += n
        if self.taken > self.cap:
            raise Unreadable(f"larger than {self.cap} bytes", "too_large")
        if self.head and self.taken > MAX_HEAD:
            raise Unreadable(f"a head larger than {MAX_HEAD} bytes", "too_large")

    def piece(self, n: int) -> None:
        """A piece of body of `n` bytes arrived (its bytes are charged already): charged up to MIN_PIECE."""
        if n < MIN_PIECE:
            self.charge(MIN_PIECE - n)


METER: ContextVar[Meter | None] = ContextVar("engine_metrics_meter", default=None)


class ThroughStream(httpcore.AsyncNetworkStream):
    """A network stream that hands everything to `inner`: a meter's subclass counts its reads (and here the
    httpx transport's too, gateway/upstream/httpx_head.py). What TLS wraps is wrapped the same way."""

    __slots__ = ("_inner",)

    def __init__(self, inner: httpcore.AsyncNetworkStream) -> None:
        self._inner = inner

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return await self._inner.read(max_bytes, timeout)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        await self._inner.write(buffer, timeout)

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def start_tls(
        self, ssl_context: ssl.SSLContext, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.AsyncNetworkStream:
        return type(self)(await self._inner.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> Any:  # httpcore's own type: a socket, an SSL object, a flag
        return self._inner.get_extra_info(info)


class ThroughNetwork(httpcore.AsyncNetworkBackend):
    """A network backend whose every connection is `stream`'s wrapping of `inner`'s."""

    stream: ClassVar[type[ThroughStream]] = ThroughStream

    def __init__(self, inner: httpcore.AsyncNetworkBackend) -> None:
        self._inner = inner

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        return self.stream(await self._inner.connect_tcp(host, port, timeout, local_address, socket_options))

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None
    ) -> httpcore.AsyncNetworkStream:
        return self.stream(await self._inner.connect_unix_socket(path, timeout, socket_options))

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class _Stream(ThroughStream):
    # What TLS decrypts is what is charged (a proxy's CONNECT answer before it, as head).
    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        meter = METER.get()
        if meter is None:
            return await self._inner.read(max_bytes, timeout)
        data = await self._inner.read(min(max_bytes, HEAD_STEP) if meter.head else max_bytes, timeout)
        meter.charge(len(data))
        return data


class _Network(ThroughNetwork):
    stream = _Stream


def pool(ssl_context: ssl.SSLContext, proxy: str | None) -> httpcore.AsyncConnectionPool:
    """Connections to one provider's replicas for their metrics: its TLS settings and proxy, the network metered."""
    via = None
    if proxy:
        parsed = httpx.Proxy(proxy)  # the credentials in the URL, as the provider's completions send them
        url = parsed.url
        via = httpcore.Proxy(
            url=httpcore.URL(scheme=url.raw_scheme, host=url.raw_host, port=url.port, target=url.raw_path),
            auth=parsed.raw_auth,
        )
    return httpcore.AsyncConnectionPool(
        ssl_context=ssl_context,
        proxy=via,
        # One connection per replica at most (each is read by one task, a read at a time): never a queue.
        max_connections=None,
        keepalive_expiry=_KEEPALIVE_S,
        network_backend=_Network(httpcore.AnyIOBackend()),
    )
