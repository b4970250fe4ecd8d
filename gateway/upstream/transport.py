"""What every transport speaks: the `Transport` protocol, the `Reply` it hands back, and `Timeouts`.

A value-and-protocol module at the bottom of the upstream wing, so the transports (h1, httpx), the
client that picks one and the wings above (a route plan's timeouts, the failover loop) share the
types without importing the client.
"""

from __future__ import annotations

import math
from collections.abc import AsyncGenerator, Mapping
from typing import Protocol

import msgspec

from gateway.config import TimeoutsConfig
from gateway.upstream.h1wire import Failed
from wire.upstream import UpstreamRequest


class Timeouts(msgspec.Struct, frozen=True):
    connect: float
    first_byte: float  # bounds the wait for the first byte and every later read of a stream
    total: float
    # A stream's time since its last event that carried anything for the client: the reader of its events
    # applies it (gateway/path/events.py), not the transport. Built without a config (a probe): none.
    stream_idle: float = math.inf

    @classmethod
    def of(cls, cfg: TimeoutsConfig) -> Timeouts:
        idle = cfg.first_byte_ms if cfg.stream_idle_ms is None else cfg.stream_idle_ms
        return cls(cfg.connect_ms / 1000, cfg.first_byte_ms / 1000, cfg.total_ms / 1000, idle / 1000)

    def capped(self, total: float | None) -> Timeouts:
        """The request's own `inference_timeout` can only shorten the deadline, never extend it."""
        if total is None or total >= self.total:
            return self
        return Timeouts(min(self.connect, total), min(self.first_byte, total), total, self.stream_idle)


class Response(msgspec.Struct):
    status: int
    headers: Mapping[str, str]
    body: bytes


class Reply(Protocol):
    """An answer whose status and headers have arrived and whose body is read once, whole or in chunks.

    `release()` hands the connection back: to the pool only when the body was read to its end,
    otherwise it is closed, so no later request can read what is left of this one.
    """

    @property
    def status(self) -> int: ...

    @property
    def headers(self) -> Mapping[str, str]: ...

    @property
    def last_wait(self) -> float:
        """`time.monotonic()` when the reader last began to wait for more of the body (0.0 before it ever did):
        the clock reading each wait takes anyway, for a stream's idle time (gateway/path/events.py)."""
        ...

    async def read(self) -> bytes: ...

    def iter_chunks(self, failed: Failed | None = None) -> AsyncGenerator[bytes, None]:
        """The body as it arrives; a failure (`h1wire.FAILURES`) raises `failed(exc)` in its place when given."""
        ...

    def release(self) -> None: ...

    def settle(self) -> None:
        """The answer's content ended before its body did (its end-of-stream event came): nothing more is
        read, and the connection is pooled only if the rest of the body comes at once."""
        ...


class Transport(Protocol):
    """One provider's pooled connections. Failures raise the `h1` kinds or `TimeoutError`."""

    name: str

    async def request(self, req: UpstreamRequest, timeouts: Timeouts) -> Reply: ...

    async def close(self) -> None: ...
