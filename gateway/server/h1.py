"""`H1Protocol`: a connection of HTTP/1.1 for uvicorn (`uvicorn.Config(http=H1Protocol)`).

Requests are parsed by httptools (llhttp, C); each runs the ASGI app in a task of its own, one at a time
per connection: pipelined requests wait their turn with reading paused. No timer is armed or cancelled
per request: one timer per connection wakes at most once per keep-alive period, and when it finds the
connection still waiting for a request it closes it (nothing came: the keep-alive timeout; a head begun
but not finished: the head timeout).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections import deque
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import unquote

import httptools
from uvicorn.protocols.http.flow_control import service_unavailable
from uvicorn.protocols.utils import get_local_addr, get_remote_addr, is_ssl

from gateway.grace import Grace
from gateway.server.cycle import DISCONNECT, App, Cycle, answer

if TYPE_CHECKING:
    from uvicorn.config import Config
    from uvicorn.server import ServerState

log = logging.getLogger("uvicorn.error")

MAX_HEAD_BYTES = 65_536  # request line and headers; more: 431 (a longer URL alone: 414)
MAX_HEADERS = 100  # header lines in a request; more: 431
MAX_PIPELINED = 64  # requests parsed and waiting behind the one being answered; more: 503, then close
HEAD_TIMEOUT_S = 10.0  # from the end of the previous answer (or the connection's start) to a whole head
BODY_HIGH_WATER = 65_536  # request body buffered, unread by the app, before reading pauses
LINGER_S = 2.0  # after an answer that ends the connection early, what the client still sends is dropped this long
LINGER_BYTES = 1_048_576  # ... and at most this much, then the close
# A client that takes none of an answer's bytes this long, while the server has more to write: the connection is
# aborted, so the request ends and gives back what it holds (a server's slot, a lease), as nginx's send_timeout.
SEND_TIMEOUT_S = 60.0


class _Refused(Exception):
    """Raised inside a parser callback to stop parsing; the connection's `refusal` says the answer."""


class H1Protocol(asyncio.Protocol):
    """One client connection: parse, run the app per request, answer, keep alive or close."""

    max_head_bytes = MAX_HEAD_BYTES
    max_headers = MAX_HEADERS
    head_timeout_s = HEAD_TIMEOUT_S
    linger_s = LINGER_S
    linger_bytes = LINGER_BYTES
    send_timeout_s = SEND_TIMEOUT_S

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        if not config.loaded:
            config.load()
        self.app = cast(App, config.loaded_app)
        self.loop = _loop or asyncio.get_event_loop()
        self.state = server_state
        self.connections = cast(set[Any], server_state.connections)
        self.tasks = server_state.tasks
        self.app_state = app_state
        self.root_path: str = config.root_path
        self.raw_root = self.root_path.encode("ascii")
        self.asgi = {"version": config.asgi_version, "spec_version": "2.3"}
        self.keep_alive_s: float = config.timeout_keep_alive
        self.limit_concurrency: int | None = config.limit_concurrency
        self.fresh_context: bool = bool(getattr(config, "reset_contextvars", False))
        self.parser = httptools.HttpRequestParser(self)
        # Answer a request even when the client sent more after `Connection: close`, as uvicorn does.
        self.parser.set_dangerous_leniencies(lenient_data_after_close=True)

        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self.server: tuple[str, int | None] | None = None
        self.client: tuple[str, int] | None = None
        self.scheme = "http"
        self.current: Cycle | None = None  # the request the app is answering
        self.parsing: Cycle | None = None  # the request whose body the parser is reading
        self.pipeline: deque[tuple[Cycle, App]] = deque()  # parsed, waiting for `current` to finish
        # The head being parsed.
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.head_size = 0
        self.expect_100 = False
        self.in_head = True  # between requests: the bytes that come are a head's
        self.head_bytes = 0  # bytes received since then
        self.refusal: tuple[int, bytes] | None = None
        # Flow control and the connection's end.
        self.read_paused = False
        self.hold_reading = False  # an error answer or an upgrade is pending: read nothing more
        self.write_paused = False
        self.drained: asyncio.Future[None] | None = None
        self.draining = False  # the server is shutting down: close after the answers in progress
        self.failed: bytes | None = None  # an error answer to send once the answers before it are out
        self.waiting = True  # no request in progress: the timer may close the connection
        self.idle_at = 0.0
        self.timer: asyncio.TimerHandle | Grace | None = None
        self.looked = 0.0  # the deadline last given one more read of the socket before the close
        self.linger: asyncio.TimerHandle | None = None  # set while closing: our side is shut, reads are dropped
        self.linger_left = 0
        self._default_src: list[tuple[bytes, bytes]] | None = None
        self._default_head = b""

    # asyncio

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.connections.add(self)
        self.server = get_local_addr(self.transport)
        self.client = get_remote_addr(self.transport)
        if is_ssl(self.transport):
            self.scheme = "https"
        self._idle()

    def connection_lost(self, exc: Exception | None) -> None:
        self.connections.discard(self)
        current = self.current
        if current is not None and not current.complete:
            current.left()
        self.pipeline.clear()
        self.resume_writing()
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.linger is not None:
            self.linger.cancel()
        if exc is None:
            self.transport.close()
        # No more bytes come: the parser (whose callbacks are this protocol's methods) and the requests it
        # parsed are let go of, else each closed connection would be a cycle the collector alone frees.
        self.parser = None  # type: ignore[assignment]
        self.parsing = self.current = None

    def eof_received(self) -> None:
        """A client's half-close ends the connection (as under uvicorn): the transport closes."""

    def data_received(self, data: bytes) -> None:
        if self.hold_reading:
            # Read before reading paused (the connection ends after the answers under way), or while closing.
            if self.linger is not None:
                self.linger_left -= len(data)
                if self.linger_left < 0:
                    self.transport.close()
            return
        if self.in_head:
            self.head_bytes += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._upgrade()
        except httptools.HttpParserError:
            status, text = self.refusal or (400, b"Invalid HTTP request received.")
            if status == 400:
                log.warning("Invalid HTTP request received.")
            self._refuse(status, text)
        else:
            # A head that arrives in pieces is counted by bytes received: the parser keeps its parts.
            if self.in_head and self.head_bytes > self.max_head_bytes:
                self._refuse(431, b"Request header fields too large.")

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        drained = self.drained
        if drained is not None:
            self.drained = None
            if not drained.done():
                drained.set_result(None)

    # uvicorn

    def shutdown(self) -> None:
        """The server is stopping: close at once when idle, else after the answers already under way."""
        self.draining = True
        if self.current is None and not self.pipeline:
            self.transport.close()
        elif self.current is not None and not self.pipeline:
            self.current.keep_alive = False

    # httptools callbacks

    def on_url(self, url: bytes) -> None:
        self.url += url
        if len(self.url) > self.max_head_bytes:
            self.refusal = (414, b"Request URI too long.")
            raise _Refused

    def on_header(self, name: bytes, value: bytes) -> None:
        self.head_size += len(name) + len(value) + 4
        if len(self.headers) >= self.max_headers or self.head_size > self.max_head_bytes:
            self.refusal = (431, b"Request header fields too large.")
            raise _Refused
        name = name.lower()
        if name == b"expect" and value.lower() == b"100-continue":
            self.expect_100 = True
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        parser = self.parser
        url, headers, expect_100 = self.url, self.headers, self.expect_100
        self.url, self.headers, self.head_size, self.expect_100 = b"", [], 0, False
        self.in_head, self.head_bytes, self.waiting = False, 0, False
        if url[:1] == b"/" and b"#" not in url:
            raw_path, _, query = url.partition(b"?")
        else:  # absolute form, `*`, a fragment
            parsed = httptools.parse_url(url)
            raw_path, query = parsed.path or b"", parsed.query or b""
        path = raw_path.decode("ascii")
        if "%" in path:
            path = unquote(path)
        version = parser.get_http_version()
        scope = {
            "type": "http",
            "asgi": self.asgi,
            "http_version": version,
            "server": self.server,
            "client": self.client,
            "scheme": self.scheme,
            "method": parser.get_method().decode("ascii"),
            "root_path": self.root_path,
            "path": self.root_path + path if self.root_path else path,
            "raw_path": self.raw_root + raw_path if self.raw_root else raw_path,
            "query_string": query,
            "headers": headers,
            "state": self.app_state.copy(),
        }
        cycle = self.parsing = Cycle(self, scope, version != "1.0" and parser.should_keep_alive(), expect_100)
        scope["extensions"] = {DISCONNECT: cycle.subscribe}
        if parser.should_upgrade():
            # No upgrade is served (websocket, h2c): the request is answered as plain HTTP/1.1, and the
            # connection closes after it, as what the client sends next would be in the other protocol.
            cycle.keep_alive = False
        app = self.app
        limit = self.limit_concurrency
        if limit is not None and (len(self.connections) >= limit or len(self.tasks) >= limit):
            log.warning("Exceeded concurrency limit.")
            app = cast(App, service_unavailable)
        if self.current is None:
            self._run(cycle, app)
        elif len(self.pipeline) >= MAX_PIPELINED:
            # One read can hold thousands of tiny requests: each waiting one is a scope and a cycle. The
            # ones already queued are answered, then this refusal, then the connection closes.
            self.refusal = (503, b"Too many pipelined requests.")
            raise _Refused
        else:
            self.pipeline.append((cycle, app))
            self.pause_reading()

    def on_body(self, body: bytes) -> None:
        cycle = self.parsing
        if cycle is None or cycle.complete:
            return
        cycle.body += body
        if len(cycle.body) > BODY_HIGH_WATER:
            self.pause_reading()
        cycle.wake()

    def on_message_complete(self) -> None:
        self.in_head = True
        cycle = self.parsing
        if cycle is None or cycle.complete:
            return
        cycle.more_body = False
        cycle.wake()

    # The requests

    def _run(self, cycle: Cycle, app: App) -> None:
        self.current = cycle
        if self.fresh_context:
            task = self.loop.create_task(cycle.run(app), context=contextvars.Context())
        else:
            task = self.loop.create_task(cycle.run(app))
        cycle.task = task
        self.tasks.add(task)

    def response_done(self) -> None:
        """The current request's answer is out: start the next pipelined one, or wait for one."""
        self.state.total_requests += 1
        self.current = None
        if self.linger is not None or self.transport.is_closing():
            return
        if self.pipeline:
            cycle, app = self.pipeline.popleft()
            if not self.pipeline:
                self.resume_reading()
            if self.draining and not self.pipeline:
                cycle.keep_alive = False
            self._run(cycle, app)
        elif self.failed is not None:
            self.transport.write(self.failed)
            self.close_lingering()
        elif self.draining:
            self.transport.close()
        else:
            self.resume_reading()
            self._idle()

    # Flow control

    def pause_reading(self) -> None:
        if not self.read_paused:
            self.read_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.read_paused and not self.hold_reading and not self.pipeline:
            self.read_paused = False
            self.transport.resume_reading()

    async def drain(self) -> None:
        if self.drained is None or self.drained.done():
            self.drained = self.loop.create_future()
        drained = self.drained
        # Only a paused write waits here (the client's window is full), so the timer costs nothing per answer.
        stalled = self.loop.call_later(self.send_timeout_s, self._stalled, drained)
        try:
            await drained
        finally:
            stalled.cancel()

    def _stalled(self, drained: asyncio.Future[None]) -> None:
        if drained.done() or self.transport.is_closing():
            return
        log.info("a client took no bytes of its answer for %.0f s: connection closed", self.send_timeout_s)
        # An abort, not a close: a close would wait for the buffered bytes the client is not taking.
        self.transport.abort()

    # Answers of the server's own

    def default_head(self) -> bytes:
        """uvicorn's default headers (date; server when configured) as header lines, rebuilt when it renews them."""
        source = self.state.default_headers
        if source is not self._default_src:
            self._default_src = source
            self._default_head = b"".join(b"%s: %s\r\n" % (name, value) for name, value in source)
        return self._default_head

    def _refuse(self, status: int, text: bytes) -> None:
        """A request that cannot be served: answered (after the answers before it) and the connection closed."""
        self.hold_reading = True
        self.pause_reading()
        data = answer(status, self.default_head(), text)
        broken = self.parsing
        if broken is not None and broken.more_body and not broken.complete:
            # The error is in this request's body, which will now never end: its app would wait on
            # `receive` for as long as the client stays. It is told the client left, and the refusal is
            # its answer unless some of another already went out (then only the close can end it).
            self.parsing = None
            if broken is self.current:
                broken.left()
                if broken.sent:
                    self.transport.close()
                    return
                self.current = None
            elif self.pipeline and self.pipeline[-1][0] is broken:
                self.pipeline.pop()
        if self.current is None and not self.pipeline:
            if not self.transport.is_closing():
                self.transport.write(data)
                self.close_lingering()
        else:
            self.failed = data

    def end(self) -> None:
        """Closes after the answer just written: lingering when the client may still be sending its request."""
        if self.in_head:
            self.transport.close()
        else:  # the parser is inside a request: the rest of its body is on its way
            self.close_lingering()

    def close_lingering(self) -> None:
        """Closes after an answer the client may still be sending into (a refusal, a body left unread).

        A socket closed with bytes unread, or receiving more after its close, is reset by the kernel, and a
        reset can destroy the answer before the client reads it. So the answer leaves with a FIN instead,
        and what arrives after it is read and dropped until the client closes its side, or `linger_s` or
        `linger_bytes` run out (as nginx's lingering close).
        """
        transport = self.transport
        if transport.is_closing() or self.linger is not None:
            return
        if not transport.can_write_eof():  # TLS: no half-close
            transport.close()
            return
        transport.write_eof()
        self.hold_reading = True
        self.waiting = False
        self.pipeline.clear()
        self.linger_left = self.linger_bytes
        self.linger = self.loop.call_later(self.linger_s, transport.close)
        if self.read_paused:
            self.read_paused = False
            transport.resume_reading()

    def _upgrade(self) -> None:
        log.warning("Unsupported upgrade request.")
        # The parser goes on as if the upgrade were refused; nothing the client sends next is read.
        self.hold_reading = True
        self.pause_reading()

    # Timeouts

    def _idle(self) -> None:
        self.waiting = True
        self.idle_at = self.loop.time()
        if self.timer is None:
            self.timer = self.loop.call_at(self.idle_at + self.keep_alive_s, self._on_timer)

    def _on_timer(self) -> None:
        self.timer = None
        if not self.waiting or self.transport.is_closing():
            return  # a request is in progress: the timer is armed again when the connection waits again
        limit = self.head_timeout_s if self.head_bytes else self.keep_alive_s
        deadline = self.idle_at + max(limit, self.keep_alive_s)
        if self.loop.time() < deadline:
            self.timer = self.loop.call_at(deadline, self._on_timer)
        elif self.looked != deadline:
            # A request may have come in time, only not read yet: a loop held busy past the deadline runs
            # its timers before it reads its sockets (gateway/grace.py). Look again after the next read.
            self.looked = deadline
            self.timer = Grace(self.loop, self._on_timer)
        else:
            self.transport.close()
