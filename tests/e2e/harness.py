"""Real servers for the end-to-end suite: the gateway, loopback upstreams and Redis.

Nothing here stands in for the project's code. The gateway is `gateway.app.create_app` served by a
real uvicorn (uvloop + httptools, as `python -m gateway serve` runs it) in a background thread with
its own event loop, on a real socket; or the CLI itself as a child process. Upstreams are real
aiohttp servers on 127.0.0.1 that replay recorded provider bodies and record what they received.
Redis is a real `redis-server` on a free port. Everything binds to loopback and is stopped by the
fixture that started it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import uvicorn
from aiohttp import web

from gateway.app import create_app
from gateway.config import load_config
from gateway.pipeline import Pipeline

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def fixture_bytes(name: str) -> bytes:
    """A recorded provider body from tests/fixtures (copied from /work/shared/fixtures; see SOURCES.md)."""
    return (FIXTURES / name).read_bytes()


def fixture_json(name: str) -> Any:
    return json.loads(fixture_bytes(name))


def recorded_headers(name: str) -> dict[str, str]:
    """A `*.headers.json` recording ({name: [values]}) as single-valued response headers."""
    raw: dict[str, list[str]] = fixture_json(name)
    return {k: v[0] for k, v in raw.items()}


def sse_events(raw: bytes) -> list[bytes]:
    """Split a recorded SSE body into its events, each without the blank line that ends it."""
    return [e for e in raw.replace(b"\r\n", b"\n").split(b"\n\n") if e.strip()]


def sse_data(body: str) -> list[str]:
    """The `data:` payloads of an SSE body the gateway sent, in order (it always frames `data: X\\n\\n`)."""
    out: list[str] = []
    for event in body.split("\n\n"):
        if not event:
            continue
        assert event.startswith("data: "), f"unexpected SSE framing: {event!r}"
        out.append(event[len("data: ") :])
    return out


def openai_client(base_url: str, api_key: str, **kwargs: Any) -> openai.OpenAI:
    """The official SDK pointed at the gateway: no retries (tests assert single attempts), no proxies."""
    return openai.OpenAI(
        base_url=base_url,
        api_key=api_key,
        max_retries=0,
        timeout=15,
        http_client=openai.DefaultHttpxClient(trust_env=False),
        **kwargs,
    )


def async_openai_client(base_url: str, api_key: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=base_url,
        api_key=api_key,
        max_retries=0,
        timeout=15,
        http_client=openai.DefaultAsyncHttpxClient(trust_env=False),
    )


# --------------------------------------------------------------------------------------------------
# Loopback upstream


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


def reply_sse(events: Sequence[bytes], headers: Mapping[str, str] | None = None) -> Handler:
    """A handler streaming the given SSE events (each framed with its blank line), then closing."""

    async def handler(request: web.Request, received: Received) -> web.StreamResponse:
        resp = web.StreamResponse(
            headers={"content-type": "text/event-stream", **{k.lower(): v for k, v in (headers or {}).items()}}
        )
        await resp.prepare(request)
        for event in events:
            await resp.write(event + b"\n\n")
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


async def wait_for(event: threading.Event, timeout: float) -> bool:
    """Wait on a thread event from the upstream's loop without blocking it (and stay cancellable)."""
    deadline = time.monotonic() + timeout
    while not event.is_set():
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(0.005)
    return True


async def _no_listing(request: web.Request, received: Received) -> web.StreamResponse:
    return web.Response(status=404, text='{"error": "no model listing here"}', content_type="application/json")


def is_listing(method: str, path: str) -> bool:
    """A model-list call of the gateway's background discovery (GET .../models, Ollama's GET /api/tags)."""
    return method == "GET" and path.endswith(("/models", "/api/tags"))


class Upstream:
    """An aiohttp server on 127.0.0.1 in its own thread; tests set `handler` and read `received`.

    Handler tasks are cancelled when the peer (the gateway) closes the connection, so a test can observe
    that the gateway really let go of an upstream request.

    The gateway lists self-hosted upstreams' models in the background (gateway/discovery.py). Those calls
    go to `listings` (a 404 unless a test sets one) and `listed`, never to `handler` and `received`, so
    tests that count completion calls do not see them.
    """

    def __init__(self) -> None:
        self.handler: Handler = _no_handler
        self.received: list[Received] = []
        self.listings: Handler = _no_listing
        self.listed: list[Received] = []
        self._loop = asyncio.new_event_loop()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("127.0.0.1", 0))
        self.port = int(self._sock.getsockname()[1])
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name="e2e-upstream", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

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
        await web.SockSite(self._runner, self._sock).start()

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


# --------------------------------------------------------------------------------------------------
# The gateway


class GatewayThread:
    """`create_app(load_config(path))` served by uvicorn in a thread, like `serve` (uvloop, httptools)."""

    def __init__(self, config_path: Path, env: Mapping[str, str]) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("127.0.0.1", 0))
        self.port = int(self._sock.getsockname()[1])
        app = self.app = create_app(load_config(config_path, env=dict(env)))
        config = uvicorn.Config(
            app,
            loop="uvloop",
            http="httptools",
            lifespan="on",
            log_level="warning",
            access_log=False,
            timeout_graceful_shutdown=2,
        )
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self._sock]}, name="e2e-gateway", daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pipeline(self) -> Pipeline:
        """The pipeline serving now (a config reload replaces it)."""
        current: Pipeline = self.app.state.pipeline
        return current

    def start(self) -> None:
        self._thread.start()
        deadline = time.monotonic() + 15
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the gateway did not start")
            time.sleep(0.01)

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join(15)
        self._sock.close()
        assert not self._thread.is_alive(), "the gateway did not stop"


@contextlib.contextmanager
def serving(config_path: Path, env: Mapping[str, str]) -> Iterator[GatewayThread]:
    gw = GatewayThread(config_path, env)
    gw.start()
    try:
        yield gw
    finally:
        gw.stop()


# --------------------------------------------------------------------------------------------------
# The CLI as a child process


def cli_env(**extra: str) -> dict[str, str]:
    """The environment for `python -m gateway`: no proxies, no provider or Redis variables from outside."""
    drop = ("PROXY", "_API_KEY", "REDIS_URL", "VLLM_BASE_URL", "GATEWAY_CONFIG")
    env = {k: v for k, v in os.environ.items() if not any(d in k.upper() for d in drop)}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def run_cli(
    args: Sequence[str], env: Mapping[str, str] | None = None, timeout: float = 30
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", *args],
        cwd=REPO,
        env=dict(env) if env is not None else cli_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


class GatewayProcess:
    """`python -m gateway serve --config PATH --port N` as a child in its own session."""

    def __init__(
        self,
        config_path: Path,
        env: Mapping[str, str] | None = None,
        *,
        flags: Sequence[str] = (),
        prefix: Sequence[str] = (),
    ) -> None:
        """`flags`: further `serve` flags (e.g. `--server granian`); `prefix`: a command that runs it (unshare)."""
        self.port = free_port()
        self.log = config_path.with_suffix(".log")
        self._log_file = self.log.open("wb")
        cmd = [sys.executable, "-m", "gateway", "serve", "--config", str(config_path), "--port", str(self.port)]
        self.proc = subprocess.Popen(
            [*prefix, *cmd, *flags],
            cwd=REPO,
            env=dict(env) if env is not None else cli_env(),
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        with httpx.Client(trust_env=False, timeout=1) as client:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"gateway exited with {self.proc.returncode}: {self.log.read_text()}")
                try:
                    if client.get(self.url + "/health").status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                time.sleep(0.05)
        raise RuntimeError(f"gateway did not become ready: {self.log.read_text()}")

    def stop(self) -> None:
        try:
            if self.proc.poll() is None:
                self.proc.terminate()
                try:
                    self.proc.wait(10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(5)
        finally:
            self._log_file.close()


# --------------------------------------------------------------------------------------------------
# Redis


class RedisServer:
    """A real `redis-server` on a free loopback port, without persistence."""

    def __init__(self) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + 10
        while not self._pong():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("redis-server did not start")
            time.sleep(0.02)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _pong(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
