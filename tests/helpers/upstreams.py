"""Loopback upstreams: real aiohttp servers on 127.0.0.1 that play a provider and record what they got.

Each runs in its own thread and event loop, so sync tests and the gateway's own loop can both talk to
it. Tests set `handler` (a recorded body, a stream, a hang) and read `received` afterwards.
"""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from tests.helpers.servers import Running


@dataclass
class Received:
    """One request as the upstream saw it."""

    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]  # lower-cased names
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


Handler = Callable[[web.Request, Received], Awaitable[web.StreamResponse]]


async def _no_handler(request: web.Request, received: Received) -> web.StreamResponse:
    return web.Response(status=599, text=f"no upstream handler set for {received.path}")


def reply(body: bytes, status: int = 200, headers: Mapping[str, str] | None = None) -> Handler:
    """A handler answering one recorded body (JSON by default)."""
    hdrs = {"content-type": "application/json", **{k.lower(): v for k, v in (headers or {}).items()}}

    async def handler(request: web.Request, received: Received) -> web.StreamResponse:
        return web.Response(body=body, status=status, headers=hdrs)

    return handler


def reply_sse(events: Sequence[bytes], headers: Mapping[str, str] | None = None, hold_s: float = 0.0) -> Handler:
    """A handler streaming the given SSE events (each framed with its blank line), then closing; with `hold_s`,
    keeping the body open that long after them instead (it never ends within a test's bounds)."""
    return reply_stream([event + b"\n\n" for event in events], "text/event-stream", headers, hold_s)


def reply_stream(
    parts: Sequence[bytes], content_type: str, headers: Mapping[str, str] | None = None, hold_s: float = 0.0
) -> Handler:
    """A handler writing `parts` as they are (NDJSON lines, event-stream frames), one write each, then closing;
    with `hold_s`, keeping the body open that long after them instead, like `reply_sse`."""

    async def handler(request: web.Request, received: Received) -> web.StreamResponse:
        resp = web.StreamResponse(
            headers={"content-type": content_type, **{k.lower(): v for k, v in (headers or {}).items()}}
        )
        await resp.prepare(request)
        for part in parts:
            await resp.write(part)
        if hold_s:
            await asyncio.sleep(hold_s)
            return resp
        await resp.write_eof()
        return resp

    return handler


def hang(cancelled: threading.Event | None = None, seconds: float = 30) -> Handler:
    """A handler that never answers (within `seconds`); it sets `cancelled` when the peer hangs up."""

    async def handler(request: web.Request, received: Received) -> web.StreamResponse:
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            if cancelled is not None:
                cancelled.set()
            raise
        return web.Response(status=500, text="the test should have given up long ago")

    return handler


async def _no_listing(request: web.Request, received: Received) -> web.StreamResponse:
    return web.Response(status=404, text='{"error": "no model listing here"}', content_type="application/json")


def is_listing(method: str, path: str) -> bool:
    """A model-list call of the gateway's background discovery (GET .../models, Ollama's GET /api/tags)."""
    return method == "GET" and path.endswith(("/models", "/api/tags"))


class Upstream(Running):
    """An aiohttp server on 127.0.0.1 in its own thread; tests set `handler` and read `received`.

    Handler tasks are cancelled when the peer (the gateway) closes the connection, so a test can observe
    that the gateway really let go of an upstream request.

    The gateway lists self-hosted upstreams' models in the background (gateway/edge/discovery.py). Those calls
    go to `listings` (a 404 unless a test sets one) and `listed`, never to `handler` and `received`, so
    tests that count completion calls do not see them.
    """

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.tls = tls  # a server context: HTTPS at `https://localhost:<port>`
        self.handler: Handler = _no_handler
        self.received: list[Received] = []
        self.listings: Handler = _no_listing
        self.listed: list[Received] = []
        self._loop = asyncio.new_event_loop()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("127.0.0.1", 0))
        self.port = int(self._sock.getsockname()[1])
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name="test-upstream", daemon=True)

    @property
    def url(self) -> str:
        return f"https://localhost:{self.port}" if self.tls is not None else f"http://127.0.0.1:{self.port}"

    def reset(self) -> None:
        self.handler = _no_handler
        self.received = []

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        received = Received(
            method=request.method,
            path=request.path,
            query=dict(request.query),
            headers={k.lower(): v for k, v in request.headers.items()},
            body=body,
        )
        if is_listing(received.method, received.path):
            self.listed.append(received)
            return await self.listings(request, received)
        self.received.append(received)
        return await self.handler(request, received)

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._dispatch)
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        await web.SockSite(self._runner, self._sock, ssl_context=self.tls).start()

    async def _stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def start(self) -> None:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)

    def stop(self) -> None:
        try:
            asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(10)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._loop.close()
            self._sock.close()

    def only(self) -> Received:
        """The single request the upstream received since the last reset."""
        assert len(self.received) == 1, [r.path for r in self.received]
        return self.received[0]


class Recorder(Upstream):
    """An `Upstream` that also keeps each request's raw target (`request.raw_path`, undecoded)."""

    def __init__(self) -> None:
        super().__init__()
        self.raw_paths: list[str] = []

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        self.raw_paths.append(request.raw_path)
        return await super()._dispatch(request)

    def reset(self) -> None:
        super().reset()
        self.raw_paths = []
