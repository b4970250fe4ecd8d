"""One request and its answer on a connection: the ASGI `receive` and `send` that `H1Protocol` hands the app.

An answer's head is held back until its first body message, so a whole answer leaves in one
`transport.write` (one send, one segment on loopback). An answer without a content-length is given one
when its first body message is also its last; otherwise it is chunked, and its head leaves at the loop's
next turn if the first piece is not there by then, so a stream's client sees its status at once.

A stream's first piece in a turn of the loop leaves at once; the pieces the app sends after it in the same
turn (the events of one upstream read, relayed one by one) are held and leave together at the turn's end:
one send where there was one per event, and no piece waits for a later turn.
"""

from __future__ import annotations

import asyncio
import http
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Protocol

Scope = dict[str, Any]
Message = Mapping[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[object]]

# The scope's extension (`Cycle.subscribe`) that tells an app of its client leaving without a `receive`.
DISCONNECT = "gateway.disconnect"

# uvicorn's logger and words, for whoever watches its log for failed requests.
log = logging.getLogger("uvicorn.error")


class Connection(Protocol):
    """What a request needs of its connection (`H1Protocol`)."""

    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    tasks: set[asyncio.Task[None]]
    write_paused: bool
    draining: bool
    pipeline: deque[Any]

    def default_head(self) -> bytes: ...

    def response_done(self) -> None: ...

    def end(self) -> None: ...

    def resume_reading(self) -> None: ...

    async def drain(self) -> None: ...


def _status_line(code: int) -> bytes:
    try:
        phrase = http.HTTPStatus(code).phrase.encode()
    except ValueError:
        phrase = b""
    return b"HTTP/1.1 %d %s\r\n" % (code, phrase)


STATUS_LINE = {code: _status_line(code) for code in range(100, 600)}
# Above this many bytes a body is written after its head rather than copied into one buffer with it.
ONE_WRITE_MAX = 65_536
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_TOKEN = b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyz"
# Header names seen valid: most answers repeat the same few, so each is checked once per process.
_NAMES_OK: set[bytes] = {b"content-type", b"content-length", b"cache-control", b"x-request-id"}
_NAMES_CAP = 1024
_BODILESS = frozenset((204, 304))
# The names whose values decide the answer's framing or the connection's end.
_FRAMING = frozenset((b"content-length", b"transfer-encoding", b"connection"))


def _check_name(name: bytes) -> None:
    """A lowercased header name must be a token (RFC 9110): no separator, space or control character."""
    if not name or name.translate(None, _TOKEN):
        raise RuntimeError(f"Invalid HTTP header name {name!r}.")
    if len(_NAMES_OK) < _NAMES_CAP:
        _NAMES_OK.add(name)


def answer(status: int, default_head: bytes, text: bytes) -> bytes:
    """A whole plain-text answer that closes the connection (the server's own errors)."""
    return b"%s%scontent-type: text/plain; charset=utf-8\r\ncontent-length: %d\r\nconnection: close\r\n\r\n%s" % (
        STATUS_LINE[status],
        default_head,
        len(text),
        text,
    )


class Cycle:
    """A request's state from its head to the last byte of its answer."""

    __slots__ = (
        "bodiless",
        "body",
        "chunked",
        "complete",
        "conn",
        "delivered",
        "disconnected",
        "expect_100",
        "gone",
        "head",
        "held",
        "held_size",
        "keep_alive",
        "more_body",
        "open_tail",
        "remaining",
        "scope",
        "sent",
        "started",
        "task",
        "waiter",
    )

    def __init__(self, conn: Connection, scope: Scope, keep_alive: bool, expect_100: bool) -> None:
        self.conn = conn
        self.scope = scope
        self.keep_alive = keep_alive
        self.expect_100 = expect_100
        self.body = b""  # received, not yet handed to the app
        self.more_body = True  # the request's body has not ended yet
        self.delivered = False  # the last `http.request` event went out
        self.waiter: asyncio.Future[None] | None = None  # a `receive` waiting for body or disconnect
        self.task: asyncio.Task[None] | None = None
        self.started = False  # `http.response.start` came
        self.sent = False  # a byte of the answer went out
        self.complete = False  # the answer's last byte went out
        self.disconnected = False  # the client left before that
        self.head: bytes | None = None  # the answer's head, held back to go with the body
        # This turn's pieces after its first (None: no piece went out this turn), and their size.
        self.held: list[bytes] | None = None
        self.held_size = 0
        self.chunked = False
        self.remaining = -1  # content-length bytes still to send; -1: none given
        self.bodiless = False  # HEAD, 204, 304: no body goes out
        self.open_tail: bytes | None = None  # the held head's end, when its framing is not decided yet
        self.gone: Callable[[], None] | None = None  # the app's callback for the client leaving (`subscribe`)

    def subscribe(self, gone: Callable[[], None]) -> None:
        """The scope's `gateway.disconnect` extension: `gone` is called once if the client leaves before the
        answer is complete, so an app need not keep a task waiting in `receive` to learn it."""
        if self.disconnected:
            self.conn.loop.call_soon(gone)
        elif not self.complete:
            self.gone = gone

    def left(self) -> None:
        """The connection was lost before the answer was complete."""
        self.disconnected = True
        self.wake()
        gone = self.gone
        if gone is not None:
            self.gone = None
            gone()

    def wake(self) -> None:
        waiter = self.waiter
        if waiter is not None:
            self.waiter = None
            if not waiter.done():
                waiter.set_result(None)

    async def run(self, app: App) -> None:
        try:
            result = await app(self.scope, self.receive, self.send)
        except BaseException as exc:
            log.error("Exception in ASGI application\n", exc_info=exc)
            if not self.sent:
                self._fail()  # nothing of the answer went out yet: a whole 500 can
            elif not self.complete:
                self._close()
        else:
            if result is not None:
                log.error("ASGI callable should return None, but returned '%s'.", result)
                self._close()
            elif not self.started and not self.disconnected:
                log.error("ASGI callable returned without starting response.")
                self._fail()
            elif not self.complete and not self.disconnected:
                log.error("ASGI callable returned without completing response.")
                self._close()
        finally:
            self.conn.tasks.discard(self.task)
            # Both hold this cycle (the task through its coroutine, the scope through `subscribe`): left in
            # place, every request would leave a reference cycle of a dozen objects that only the collector
            # frees (a young collection of ~11,000 of them every ~800 requests, milliseconds long).
            self.task = None
            self.scope.pop("extensions", None)

    def _close(self) -> None:
        """End a connection whose answer cannot be completed, after what the app sent of it."""
        self._release()
        self.conn.transport.close()

    def _fail(self) -> None:
        if self.disconnected or self.complete:
            return
        self.keep_alive = False
        self.conn.transport.write(answer(500, self.conn.default_head(), b"Internal Server Error"))
        self._finish()

    def _finish(self) -> None:
        self.complete = True
        self.head = None
        self.gone = None
        self.wake()
        if not self.keep_alive:
            self.conn.end()
        self.conn.response_done()

    # ASGI

    async def receive(self) -> dict[str, Any]:
        if self.expect_100:
            self.expect_100 = False
            if not self.disconnected:
                self.conn.transport.write(CONTINUE)
        while True:
            if self.disconnected or self.complete:
                return {"type": "http.disconnect"}
            if not self.delivered and (self.body or not self.more_body):
                body, self.body = self.body, b""
                more = self.more_body
                self.delivered = not more
                self.conn.resume_reading()
                return {"type": "http.request", "body": body, "more_body": more}
            # Reading must run to bring the rest of the body, or to see the client leave.
            self.conn.resume_reading()
            waiter = self.waiter
            if waiter is None or waiter.done():
                waiter = self.waiter = self.conn.loop.create_future()
            await waiter

    async def send(self, message: Message) -> None:
        conn = self.conn
        if conn.write_paused and not self.disconnected:
            await conn.drain()
        if self.disconnected:
            return
        kind = message["type"]
        if not self.started:
            if kind != "http.response.start":
                raise RuntimeError(f"Expected ASGI message 'http.response.start', but got '{kind}'.")
            self.expect_100 = False
            self._start(message["status"], message.get("headers", ()))
            self.started = True  # not before: a head refused leaves room for the 500
            return
        if self.complete:
            raise RuntimeError(f"Unexpected ASGI message '{kind}' sent, after response already completed.")
        if kind != "http.response.body":
            raise RuntimeError(f"Expected ASGI message 'http.response.body', but got '{kind}'.")
        body: bytes = message.get("body", b"")
        more: bool = message.get("more_body", False)
        if self.open_tail is not None:
            self._frame(len(body), not more)
        head = self.head
        self.head = None
        if self.bodiless:
            out = head or b""
        elif self.chunked:
            if body:
                out = b"%s%x\r\n%s%s" % (head or b"", len(body), body, b"\r\n" if more else b"\r\n0\r\n\r\n")
            else:
                out = (head or b"") + (b"" if more else b"0\r\n\r\n")
        else:
            if self.remaining >= 0:
                self.remaining -= len(body)
                if self.remaining < 0:
                    raise RuntimeError("Response content longer than Content-Length")
            if head is None:
                out = body
            elif len(body) <= ONE_WRITE_MAX:
                out = head + body
            else:  # a copy of a large body costs more than a second write
                self.sent = True
                conn.transport.write(head)
                out = body
        if more:
            if out:
                self.sent = True
                held = self.held
                if held is None:
                    # The turn's first piece: out at once, and the turn's end releases what follows it.
                    self.held = []
                    conn.loop.call_soon(self._release)
                    conn.transport.write(out)
                else:
                    held.append(out)
                    self.held_size += len(out)
                    if self.held_size > ONE_WRITE_MAX:  # a long burst leaves in writes of about this much
                        self._release()
                        self.held = []
            return
        if self.remaining > 0 and not self.bodiless:
            raise RuntimeError("Response content shorter than Content-Length")
        held = self.held
        if held:
            held.append(out)
            out = b"".join(held)
        self.held = None
        if out:
            self.sent = True
            conn.transport.write(out)
        self._finish()

    def _start(self, status: int, headers: Iterable[tuple[bytes, bytes]]) -> None:
        length = -1
        chunked = close = False
        parts: list[bytes] = []
        for raw, value in headers:
            if raw in _NAMES_OK:  # seen valid, hence lowercase already: no `lower()` for the usual names
                name = raw
            else:
                name = raw.lower()
                if name not in _NAMES_OK:
                    _check_name(name)
            if name in _FRAMING:
                if name == b"content-length":
                    if length < 0:
                        length = int(value)
                elif name == b"transfer-encoding":
                    chunked = value.lower() == b"chunked"
                elif b"close" in [t.strip() for t in value.lower().split(b",")]:  # connection
                    close = True
            # A line's four parts, joined once below: no format per header.
            parts += (name, b": ", value, b"\r\n")
        block = b"".join(parts)
        lines = len(parts) >> 2
        # The names are tokens; a value must not end its line early (CR, LF) or hold NUL: one scan of all.
        if block.count(b"\n") != lines or block.count(b"\r") != lines or b"\0" in block:
            raise RuntimeError("Invalid HTTP header value: CR, LF or NUL.")
        conn = self.conn
        if close or (conn.draining and not conn.pipeline):
            self.keep_alive = False
        bodiless = self.bodiless = self.scope["method"] == "HEAD" or status in _BODILESS
        tail = b"\r\n" if close or self.keep_alive else b"connection: close\r\n\r\n"
        head = STATUS_LINE[status] + conn.default_head() + block
        if chunked:
            self.chunked = not bodiless
            self.sent = True
            conn.transport.write(head + tail)
        elif length >= 0 or bodiless:
            self.remaining = length
            self.head = head + tail  # goes out with the body
        else:
            # The framing waits for the first body message: the whole answer (content-length, one write),
            # or the first piece of a stream (chunked). Should the app wait for something before it, the
            # head leaves on its own at the loop's next turn, so a stream's client sees its status at once.
            if self.scope["http_version"] == "1.0" and self.keep_alive:
                self.keep_alive = False
                tail = b"connection: close\r\n\r\n"
            self.head = head
            self.open_tail = tail
            conn.loop.call_soon(self._flush)

    def _frame(self, length: int, whole: bool) -> None:
        """Completes the held head with its framing: a content-length when `whole`, else chunked."""
        tail = self.open_tail
        self.open_tail = None
        if whole:
            self.head = b"%scontent-length: %d\r\n%s" % (self.head, length, tail)
            self.remaining = length
        elif self.scope["http_version"] == "1.0":
            # No chunked encoding in HTTP/1.0: the body runs to the connection's close.
            self.head = b"%s%s" % (self.head, tail)
        else:
            self.chunked = True
            self.head = b"%stransfer-encoding: chunked\r\n%s" % (self.head, tail)

    def _release(self) -> None:
        """The pieces held this turn, in one write; the next piece is the first of its turn."""
        held, self.held = self.held, None
        self.held_size = 0
        if held and not self.disconnected:
            self.conn.transport.write(held[0] if len(held) == 1 else b"".join(held))

    def _flush(self) -> None:
        if self.open_tail is None or self.disconnected or self.complete:
            return
        self._frame(0, False)
        head, self.head = self.head, None
        if head:
            self.sent = True
            self.conn.transport.write(head)
