"""All upstream I/O: pooled keep-alive connections per provider, timeouts, transport-error mapping.

aiohttp drives the sockets because it is the fastest client available to a Python proxy on this
machine (about 2.4x httpx over its aiohttp transport and 7.7x httpx's default transport in the
figures in issue 2); adapters stay transport-free, so swapping this module swaps the client.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from types import TracebackType
from typing import Final

import aiohttp
import msgspec

from gateway.config import LoadedConfig, TimeoutsConfig
from gateway.errors import GatewayError, UpstreamConnectError, UpstreamTimeoutError
from providers.base import UpstreamRequest

# Transport failures -> gateway errors, most specific first (aiohttp's timeouts are also ClientErrors).
_ERRORS: Final[tuple[tuple[type[BaseException], type[GatewayError], str], ...]] = (
    (TimeoutError, UpstreamTimeoutError, "timed out"),
    (aiohttp.ClientConnectorError, UpstreamConnectError, "could not be reached"),
    (aiohttp.ServerDisconnectedError, UpstreamConnectError, "closed the connection"),
    (aiohttp.ClientPayloadError, UpstreamConnectError, "sent a truncated or malformed response"),
    (aiohttp.ClientError, UpstreamConnectError, "connection failed"),
)


def map_transport_error(exc: BaseException, provider: str) -> GatewayError:
    for kind, error, what in _ERRORS:
        if isinstance(exc, kind):
            return error(f"Upstream '{provider}' {what}", code=error.__name__)
    return UpstreamConnectError(f"Upstream '{provider}' failed", code="UpstreamConnectError")


class Timeouts(msgspec.Struct, frozen=True):
    connect: float
    first_byte: float
    total: float

    @classmethod
    def of(cls, cfg: TimeoutsConfig) -> Timeouts:
        return cls(cfg.connect_ms / 1000, cfg.first_byte_ms / 1000, cfg.total_ms / 1000)

    def capped(self, total: float | None) -> Timeouts:
        """The request's own `inference_timeout` can only shorten the deadline, never extend it."""
        if total is None or total >= self.total:
            return self
        return Timeouts(min(self.connect, total), min(self.first_byte, total), total)

    def client(self) -> aiohttp.ClientTimeout:
        # sock_read bounds the wait for the first byte and every later read of a stream.
        return aiohttp.ClientTimeout(total=self.total, sock_connect=self.connect, sock_read=self.first_byte)


class Response(msgspec.Struct):
    status: int
    headers: Mapping[str, str]
    body: bytes


class Stream:
    """An open upstream response whose body is read chunk by chunk; always close() it."""

    def __init__(self, provider: str, resp: aiohttp.ClientResponse) -> None:
        self.provider = provider
        self._resp = resp
        self.status = resp.status
        self.headers: Mapping[str, str] = resp.headers

    async def read_all(self) -> bytes:
        try:
            return await self._resp.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise map_transport_error(exc, self.provider) from None

    async def chunks(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._resp.content.iter_any():
                yield chunk
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise map_transport_error(exc, self.provider) from None

    def close(self) -> None:
        # release() returns a fully read connection to the pool; close() drops one cut short, which is
        # also how a client disconnect reaches the upstream.
        if self._resp.content.at_eof():
            self._resp.release()
        else:
            self._resp.close()

    async def __aenter__(self) -> Stream:
        return self

    async def __aexit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


class Upstream:
    def __init__(self, loaded: LoadedConfig) -> None:
        self._limits = {name: p.max_connections for name, p in loaded.providers.items()}
        self._sessions: dict[str, aiohttp.ClientSession] = {}
        self.timeouts = Timeouts.of(loaded.config.timeouts)
        self.provider_timeouts = {
            name: Timeouts.of(p.timeouts) for name, p in loaded.providers.items() if p.timeouts is not None
        }

    def timeouts_for(self, provider: str) -> Timeouts:
        return self.provider_timeouts.get(provider, self.timeouts)

    def _session(self, provider: str) -> aiohttp.ClientSession:
        session = self._sessions.get(provider)
        if session is None:
            connector = aiohttp.TCPConnector(
                limit=self._limits.get(provider, 256), keepalive_timeout=30, ttl_dns_cache=300
            )
            session = aiohttp.ClientSession(
                connector=connector, auto_decompress=True, skip_auto_headers=("User-Agent",)
            )
            self._sessions[provider] = session
        return session

    async def close(self) -> None:
        sessions, self._sessions = list(self._sessions.values()), {}
        for s in sessions:
            await s.close()

    async def send(self, provider: str, req: UpstreamRequest, timeouts: Timeouts) -> Response:
        try:
            async with self._session(provider).request(
                req.method, req.url, data=req.body, headers=req.headers, timeout=timeouts.client()
            ) as resp:
                body = await resp.read()
                return Response(status=resp.status, headers=resp.headers, body=body)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise map_transport_error(exc, provider) from None

    async def open_stream(self, provider: str, req: UpstreamRequest, timeouts: Timeouts) -> Stream:
        try:
            resp = await self._session(provider).request(
                req.method, req.url, data=req.body, headers=req.headers, timeout=timeouts.client()
            )
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise map_transport_error(exc, provider) from None
        except asyncio.CancelledError:
            raise
        return Stream(provider, resp)
