"""All upstream I/O: pooled keep-alive connections per provider, timeouts, transport-error mapping.

The sockets are driven by `gateway.h1`, a lean HTTP/1.1 client on asyncio protocols and llhttp: it
costs a saturated worker a fraction of what aiohttp's client did (docs/performance.md). Adapters stay
transport-free, so swapping this module swaps the client.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from types import TracebackType
from typing import Final

import msgspec

from gateway import h1
from gateway.config import LoadedConfig, TimeoutsConfig
from gateway.errors import GatewayError, UpstreamConnectError, UpstreamTimeoutError
from providers.base import UpstreamRequest

# Transport failures -> gateway errors, most specific first.
_ERRORS: Final[tuple[tuple[type[BaseException], type[GatewayError], str], ...]] = (
    (TimeoutError, UpstreamTimeoutError, "timed out"),
    (h1.ConnectFailed, UpstreamConnectError, "could not be reached"),
    (h1.Disconnected, UpstreamConnectError, "closed the connection"),
    (h1.Malformed, UpstreamConnectError, "sent a truncated or malformed response"),
    (OSError, UpstreamConnectError, "connection failed"),
)
_TRANSPORT: Final = (OSError, TimeoutError, ValueError)


def map_transport_error(exc: BaseException, provider: str) -> GatewayError:
    for kind, error, what in _ERRORS:
        if isinstance(exc, kind):
            return error(f"Upstream '{provider}' {what}", code=error.__name__)
    return UpstreamConnectError(f"Upstream '{provider}' failed", code="UpstreamConnectError")


class Timeouts(msgspec.Struct, frozen=True):
    connect: float
    first_byte: float  # bounds the wait for the first byte and every later read of a stream
    total: float

    @classmethod
    def of(cls, cfg: TimeoutsConfig) -> Timeouts:
        return cls(cfg.connect_ms / 1000, cfg.first_byte_ms / 1000, cfg.total_ms / 1000)

    def capped(self, total: float | None) -> Timeouts:
        """The request's own `inference_timeout` can only shorten the deadline, never extend it."""
        if total is None or total >= self.total:
            return self
        return Timeouts(min(self.connect, total), min(self.first_byte, total), total)


class Response(msgspec.Struct):
    status: int
    headers: Mapping[str, str]
    body: bytes


class Stream:
    """An open upstream response whose body is read chunk by chunk; always close() it."""

    def __init__(self, provider: str, resp: h1.Response) -> None:
        self.provider = provider
        self._resp = resp
        self.status = resp.status
        self.headers: Mapping[str, str] = resp.headers

    async def read_all(self) -> bytes:
        try:
            return await self._resp.read()
        except _TRANSPORT as exc:
            raise map_transport_error(exc, self.provider) from None

    async def chunks(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._resp.iter_chunks():
                yield chunk
        except _TRANSPORT as exc:
            raise map_transport_error(exc, self.provider) from None

    def close(self) -> None:
        # A fully read connection goes back to the pool; one cut short is closed, which is also how a
        # client disconnect reaches the upstream.
        self._resp.release()

    async def __aenter__(self) -> Stream:
        return self

    async def __aexit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


class Upstream:
    def __init__(self, loaded: LoadedConfig) -> None:
        self._limits = {name: p.max_connections for name, p in loaded.providers.items()}
        self._clients: dict[str, h1.Client] = {}
        self.timeouts = Timeouts.of(loaded.config.timeouts)
        self.provider_timeouts = {
            name: Timeouts.of(p.timeouts) for name, p in loaded.providers.items() if p.timeouts is not None
        }

    def timeouts_for(self, provider: str) -> Timeouts:
        return self.provider_timeouts.get(provider, self.timeouts)

    def _client(self, provider: str) -> h1.Client:
        client = self._clients.get(provider)
        if client is None:
            client = self._clients[provider] = h1.Client(self._limits.get(provider, 256))
        return client

    async def close(self) -> None:
        clients, self._clients = list(self._clients.values()), {}
        for c in clients:
            c.close()

    async def _open(self, provider: str, req: UpstreamRequest, timeouts: Timeouts) -> h1.Response:
        try:
            return await self._client(provider).request(
                req.method,
                req.url,
                req.headers,
                req.body,
                connect_s=timeouts.connect,
                first_byte_s=timeouts.first_byte,
                total_s=timeouts.total,
            )
        except _TRANSPORT as exc:
            raise map_transport_error(exc, provider) from None

    async def send(self, provider: str, req: UpstreamRequest, timeouts: Timeouts) -> Response:
        resp = await self._open(provider, req, timeouts)
        try:
            body = await resp.read()
        except _TRANSPORT as exc:
            raise map_transport_error(exc, provider) from None
        finally:
            resp.release()
        return Response(status=resp.status, headers=resp.headers, body=body)

    async def open_stream(self, provider: str, req: UpstreamRequest, timeouts: Timeouts) -> Stream:
        return Stream(provider, await self._open(provider, req, timeouts))
