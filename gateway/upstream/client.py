"""All upstream I/O: one `Transport` per provider, timeouts, transport-error mapping.

Two transports (`h1`, lean, and `httpx`, for proxies, CA bundles, mTLS and HTTP/2) raise the same four
failure kinds with the same causes, so `map_transport_error` gives a client the same gateway error
whichever carried the request; adapters stay transport-free. Details: docs/architecture.md.
"""

from __future__ import annotations

import logging
import urllib.request
from collections.abc import AsyncGenerator, Callable, Coroutine, Mapping
from types import TracebackType
from typing import Any, cast
from urllib.parse import urlsplit

from gateway.config import CapsConfig, LoadedConfig, ProviderConfig, replica_url
from gateway.ops import tracing
from gateway.upstream import h1
from gateway.upstream.transport import Reply, Response, Timeouts, Transport
from providers import REGISTRY
from providers.base import Adapter
from wire.errors import (
    TIMEOUTS,
    GatewayError,
    UpstreamError,
    upstream_failure,
)
from wire.upstream import UpstreamRequest

log = logging.getLogger("gateway.upstream")  # the name it had as one module: operators filter on it


def transport_cause(exc: BaseException) -> str:
    """The failure's cause (wire.errors.CAUSES) as the transport classified it when it raised it."""
    if isinstance(exc, TimeoutError):
        # Both transports raise TimeoutError(<which timeout>); one from elsewhere is the request's deadline.
        cause = exc.args[0] if exc.args else None
        return cause if isinstance(cause, str) and cause in TIMEOUTS else "total_timeout"
    if isinstance(exc, h1.ConnectFailed | h1.Disconnected | h1.Malformed):
        return exc.cause
    if isinstance(exc, ConnectionResetError):
        return "connection_reset"
    # A ValueError: the request itself could not be written as HTTP (a header with a line break).
    return "connect_failed" if isinstance(exc, OSError) else "unsendable_request"


def map_transport_error(exc: BaseException, provider: str, target: str | None = None) -> GatewayError:
    """The gateway error for a transport failure, naming the provider, the target and the cause."""
    if isinstance(exc, h1.TooLarge):
        # The message names the cap and its config key, never upstream bytes. Not retried: asking again
        # would bring the same answer (and the same memory) back.
        return UpstreamError(
            f"Upstream '{provider}' {exc}",
            code="upstream_answer_too_large",
            cause="answer_too_large",
            provider=provider,
            target=target,
        )
    return upstream_failure(transport_cause(exc), provider, target)


class H1Transport:
    """The fast path: `gateway.upstream.h1`, HTTP/1.1 only, direct connections, the system trust store."""

    name = "h1"

    def __init__(self, limit: int, caps: CapsConfig) -> None:
        self._client = h1.Client(
            limit,
            max_body=caps.upstream_body_bytes,
            max_header_bytes=caps.upstream_header_bytes,
            max_interim=caps.upstream_interim_answers,
        )

    def request(self, req: UpstreamRequest, timeouts: Timeouts) -> Coroutine[Any, Any, h1.Response]:
        # The client's coroutine itself, not one awaiting it: a frame less for every resume of the request.
        return self._client.request(
            req.method,
            req.url,
            req.headers,
            req.body,
            connect_s=timeouts.connect,
            first_byte_s=timeouts.first_byte,
            total_s=timeouts.total,
        )

    async def close(self) -> None:
        self._client.close()


# NO_PROXY matching as urllib (and so requests) reads it; public since Python 2, absent from typeshed.
_bypass = cast(Callable[[str, Mapping[str, str]], bool], vars(urllib.request)["proxy_bypass_environment"])


def provider_urls(p: ProviderConfig) -> list[str]:
    """Every base URL a provider's requests can go to: its own, its deployments', or its kind's default."""
    urls = [p.base_url or getattr(REGISTRY[p.kind], "default_base_url", None) or ""]
    urls += [d.base_url for d in p.deployments.values() if d.base_url]
    urls += [replica_url(r) for r in p.replicas]
    return [u for u in urls if u]


def env_proxy_applies(url: str) -> bool:
    """Whether HTTP(S)_PROXY / ALL_PROXY would send a request to `url` through a proxy (NO_PROXY respected)."""
    proxies = urllib.request.getproxies_environment()
    parts = urlsplit(url)
    if not (proxies.get(parts.scheme) or proxies.get("all")):
        return False
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return not _bypass(host, proxies)


def needs_httpx(p: ProviderConfig) -> bool:
    """What `transport: auto` decides: httpx when something h1 cannot do applies to this provider."""
    if p.proxy or p.ca_bundle or p.client_cert or p.client_key or p.http2:
        return True
    return any(env_proxy_applies(url) for url in provider_urls(p))


def transport_for(name: str, p: ProviderConfig, caps: CapsConfig) -> Transport:
    kind = p.transport
    if kind == "h1" and any(env_proxy_applies(url) for url in provider_urls(p)):
        # Chosen explicitly, so not an error; but traffic the environment means to proxy goes direct.
        log.warning("provider %s: transport h1 connects directly; the proxy environment variables do not apply", name)
    if kind == "httpx" or (kind == "auto" and needs_httpx(p)):
        from gateway.upstream.httpx_transport import HttpxTransport  # only providers that need it pay its import

        if kind == "auto":
            # Visible at start-up: auto may switch a provider to the slower client because of the environment.
            log.info("provider %s: transport httpx (needs a proxy, CA bundle, client certificate or HTTP/2)", name)
        return HttpxTransport(p, caps)
    return H1Transport(p.max_connections, caps)


class Stream:
    """An open upstream response whose body is read chunk by chunk; always close() it."""

    def __init__(self, provider: str, resp: Reply, target: str | None = None) -> None:
        self.provider = provider
        self.target = target
        self.reply = resp  # the transport's answer (`Reply.last_wait` times an idle stream)
        self.status = resp.status
        self.headers: Mapping[str, str] = resp.headers

    async def read_all(self) -> bytes:
        try:
            return await self.reply.read()
        except h1.FAILURES as exc:
            raise map_transport_error(exc, self.provider, self.target) from None

    def chunks(self) -> AsyncGenerator[bytes, None]:
        """The body as it arrives; a transport failure raises the gateway error naming this stream's target."""
        return self.reply.iter_chunks(self._failed)

    def _failed(self, exc: BaseException) -> BaseException:
        return map_transport_error(exc, self.provider, self.target)

    def settle(self) -> None:
        """The upstream sent its end-of-stream event: nothing after it is read (`Reply.settle`)."""
        self.reply.settle()

    def close(self) -> None:
        # A fully read connection goes back to the pool; one cut short is closed, which is also how a
        # client disconnect reaches the upstream.
        self.reply.release()

    async def __aenter__(self) -> Stream:
        return self

    async def __aexit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


class Upstream:
    """Every provider's transport, built once at start-up (a local provider such as `fake` has none)."""

    def __init__(self, loaded: LoadedConfig) -> None:
        caps = self._caps = loaded.config.caps
        self._transports: dict[str, Transport] = {
            name: transport_for(name, p, caps)
            for name, p in loaded.providers.items()
            if issubclass(REGISTRY[p.kind], Adapter)
        }
        self.timeouts = Timeouts.of(loaded.config.timeouts)
        self.provider_timeouts = {
            name: Timeouts.of(p.timeouts) for name, p in loaded.providers.items() if p.timeouts is not None
        }

    def timeouts_for(self, provider: str) -> Timeouts:
        return self.provider_timeouts.get(provider, self.timeouts)

    def transport(self, provider: str) -> Transport:
        found = self._transports.get(provider)
        if found is None:  # a provider the config did not list (tests drive the pool directly): h1
            found = self._transports[provider] = H1Transport(256, self._caps)
        return found

    async def close(self) -> None:
        transports, self._transports = list(self._transports.values()), {}
        for t in transports:
            await t.close()

    async def _open(self, provider: str, req: UpstreamRequest, timeouts: Timeouts, target: str | None) -> Reply:
        try:
            return await self.transport(provider).request(tracing.outgoing(req), timeouts)
        except h1.FAILURES as exc:
            raise map_transport_error(exc, provider, target) from None

    async def send(
        self, provider: str, req: UpstreamRequest, timeouts: Timeouts, target: str | None = None
    ) -> Response:
        """One buffered exchange; `target` (`provider/model[/deployment]`) is named by its errors."""
        try:  # `_open`, inlined: a coroutine less on every buffered request
            resp = await self.transport(provider).request(tracing.outgoing(req), timeouts)
        except h1.FAILURES as exc:
            raise map_transport_error(exc, provider, target) from None
        try:
            body = await resp.read()
        except h1.FAILURES as exc:
            raise map_transport_error(exc, provider, target) from None
        finally:
            resp.release()
        return Response(status=resp.status, headers=resp.headers, body=body)

    async def open_stream(
        self, provider: str, req: UpstreamRequest, timeouts: Timeouts, target: str | None = None
    ) -> Stream:
        return Stream(provider, await self._open(provider, req, timeouts, target), target)
