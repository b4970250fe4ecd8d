"""The httpx transport tests' rig: a loopback origin, a forward/CONNECT proxy, a throwaway PKI."""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import trustme
from aiohttp import web

from gateway.config import parse_config
from gateway.upstream.client import Upstream
from gateway.upstream.transport import Timeouts
from wire.upstream import UpstreamRequest

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
TIMEOUTS = Timeouts(connect=2.0, first_byte=5.0, total=10.0)
ANSWER = b'{"via":"upstream"}'


# Servers


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    peer: object


@dataclass
class Origin:
    url: str
    seen: list[Seen] = field(default_factory=list)


async def start_origin(
    tls: ssl.SSLContext | None = None, handler: Handler | None = None
) -> tuple[web.AppRunner, Origin]:
    origin = Origin("")

    async def default(request: web.Request) -> web.StreamResponse:
        return web.Response(body=ANSWER, content_type="application/json")

    async def record(request: web.Request) -> web.StreamResponse:
        await request.read()
        peer = request.transport.get_extra_info("peername") if request.transport else None
        origin.seen.append(
            Seen(request.method, request.path_qs, {k.lower(): v for k, v in request.headers.items()}, peer)
        )
        return await (handler or default)(request)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", record)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls)
    await site.start()
    port = runner.addresses[0][1]
    origin.url = f"{'https' if tls else 'http'}://{'localhost' if tls else '127.0.0.1'}:{port}"
    return runner, origin


class Proxy:
    """An HTTP proxy: CONNECT tunnels, and absolute-form requests forwarded as they are (then piped)."""

    def __init__(self) -> None:
        self.lines: list[str] = []  # the first line of every request the proxy received
        self.headers: list[dict[str, str]] = []
        self.port = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            text = head.decode("latin-1")
            first, *rest = text.split("\r\n")
            self.lines.append(first)
            self.headers.append({k.strip().lower(): v.strip() for k, _, v in (r.partition(":") for r in rest if r)})
            method, target, _ = first.split(" ")
            if method == "CONNECT":
                host, _, port = target.rpartition(":")
                up_reader, up_writer = await asyncio.open_connection(host, int(port))
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
                await writer.drain()
            else:
                url = target.removeprefix("http://")
                hostport = url.split("/", 1)[0]
                host, _, port = hostport.rpartition(":")
                up_reader, up_writer = await asyncio.open_connection(host, int(port))
                up_writer.write(head)
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass  # a cancellation is stop(): ending quietly keeps asyncio's stream callback from logging it
        finally:
            self._tasks.discard(task)
            writer.transport.abort()

    @staticmethod
    async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()
        finally:
            dst.transport.abort()


@dataclass
class Pki:
    ca: trustme.CA
    ca_file: Path
    server: ssl.SSLContext


def upstream_for(providers: str, env: dict[str, str] | None = None) -> Upstream:
    return Upstream(parse_config(f"providers:\n{providers}", env=env or {}))


async def call(upstream: Upstream, provider: str, url: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    req = UpstreamRequest(
        "POST", url + "/v1/completions", {"content-type": "application/json", **(headers or {})}, b"{}"
    )
    resp = await upstream.send(provider, req, TIMEOUTS)
    return resp.status, resp.body


@contextlib.contextmanager
def patched_environ(values: dict[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in (*values, "NO_PROXY", "no_proxy")}
    for k in ("NO_PROXY", "no_proxy"):
        os.environ.pop(k, None)
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
