"""One keep-alive connection of the upstream HTTP/1.1 client: llhttp parsing its answers, flow control, and
whether it is fit to go back to its pool (`h1.Pool`) when an answer is done with it. Details: docs/security.md.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol, cast

import httptools

from gateway.upstream.h1body import _Inflate
from gateway.upstream.h1response import Holder, Response
from gateway.upstream.h1wire import (
    Disconnected,
    Malformed,
    TooLarge,
    Watchdog,
    _head_too_large,
    _Stop,
    _too_many_interim,
)


class Pool(Holder, Protocol):
    """What a connection needs of the pool it comes from (`h1.Pool`): besides what its settled answer does."""

    max_header_bytes: int
    max_headers: int
    max_interim: int

    def put_back(self, conn: _Connection) -> None: ...

    def forget(self) -> None: ...


class _Connection(asyncio.Protocol):
    """One keep-alive connection carrying one exchange at a time."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        # Made once connected: a connection that never is gets no connection_lost to let go of it (below).
        self.parser: httptools.HttpResponseParser
        self.response: Response | None = None
        self.headers_ready: asyncio.Future[None] | None = None
        self.keep_alive = True
        self.lost = False
        self.paused = False
        self.idle_since = 0.0
        self._length_known = False
        # Per exchange (reset by `exchange`):
        self._final = False  # the final (non-1xx) answer's headers have been parsed
        self._interim = False  # a 1xx answer is being parsed
        self._complete = False  # the final answer was read to its end
        self._dirty = False  # something makes the connection unfit for reuse, whatever the answer was
        self._body_seen = False  # body bytes came out of the current data_received
        self._gap = 0  # bytes received since the last body byte (status lines, headers, framing, trailers)
        self._head_bytes = 0
        self._head_count = 0
        self._interims = 0  # interim answers before the final one
        self._first_byte_s = self._deadline = 0.0  # the exchange's timeouts, for each wait of its head
        self.watchdog = Watchdog(self.loop)  # times the head's wait and each read of the body

    # -- asyncio.Protocol ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)
        self.parser = httptools.HttpResponseParser(self)

    def data_received(self, data: bytes) -> None:
        if self.response is None or self._complete:
            # Bytes nobody asked for, while idle or after the answer ended: a reply to something else
            # (a late answer, a smuggled one, a 204's body). Whatever they are, the next request on this
            # connection would read them as its own answer.
            self._dirty = True
            self.close()
            return
        self._body_seen = False
        try:
            self.parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            if not self._complete:
                self._broken(Malformed(f"invalid HTTP response: {exc}"))
            self._dirty = True
            self.close()
            return
        if self._body_seen:
            self._gap = 0
            return
        # httptools accumulates a header (or trailer) until it ends: a never-ending one is caught here.
        self._gap += len(data)
        if self._gap > self.pool.max_header_bytes and not self._complete:
            self._broken(_head_too_large(self.pool.max_header_bytes))
        ready = self.headers_ready
        if ready is not None and not ready.done():
            # first_byte_ms bounds each wait for the head's bytes, as it bounds each read of a body (and as httpx
            # does): a head arriving in pieces, none of them late, is no timeout; total_ms still bounds it.
            self._watch_head(ready)

    def eof_received(self) -> bool:
        return False  # let the transport close; connection_lost reports what it means

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.watchdog.idle()
        # No more bytes come: the parser, whose callbacks are this connection's methods, is let go of, else each
        # closed connection would be a cycle the collector alone frees.
        self.parser = None  # type: ignore[assignment]
        resp = self.response
        if resp is None:
            return
        headers_ready = self.headers_ready
        if headers_ready is not None and not headers_ready.done():
            reset = isinstance(exc, ConnectionResetError)
            headers_ready.set_exception(
                Disconnected(
                    "the server closed the connection before answering",
                    cause="connection_reset" if reset else "connection_closed",
                )
            )
        elif not self._length_known and not resp._done and exc is None:
            # No Content-Length and not chunked: the body ends when the connection does (RFC 9112 6.3).
            resp._finish()
        else:
            resp._fail(Malformed("the response body was cut short", cause="truncated_response"))

    # -- httptools callbacks -------------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self._complete:
            # A second answer to one request: pipelined or smuggled, or the body of a 204/304.
            raise _Stop

    def on_header(self, name: bytes, value: bytes) -> None:
        size = self._head_bytes = self._head_bytes + len(name) + len(value) + 4
        count = self._head_count = self._head_count + 1
        pool = self.pool
        if size > pool.max_header_bytes or count > pool.max_headers:  # one test on the common path
            if size > pool.max_header_bytes:
                self._broken(_head_too_large(pool.max_header_bytes))
            else:
                self._broken(TooLarge(f"the response has more than {pool.max_headers} header fields"))
            raise _Stop
        if self._final:
            return  # a trailer: counted above, never merged into headers the caller may already have read
        headers = self.response.headers  # type: ignore[union-attr]  # set for as long as bytes are parsed
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        headers[key] = f"{headers[key]}, {text}" if key in headers else text

    def on_headers_complete(self) -> None:
        resp = self.response
        assert resp is not None
        status = self.parser.get_status_code()
        headers = resp.headers
        if status < 200:
            if status == 101:
                self._broken(Malformed("the server switched protocols (101) on an HTTP request"))
                raise _Stop
            if status < 100:
                self._broken(Malformed(f"invalid HTTP response: status {status}"))
                raise _Stop
            if "content-length" in headers or "transfer-encoding" in headers:
                # 1xx has no body (RFC 9110 15.2); llhttp would frame some of them by Content-Length.
                self._broken(Malformed(f"invalid HTTP response: an interim {status} with a body"))
                raise _Stop
            # An interim answer (100 Continue, 102, 103 Early Hints): the final one follows, unless they never end
            # (the byte cap would end a flood of them too, after thousands, each parsed).
            self._interims += 1
            if self._interims > self.pool.max_interim:
                self._broken(_too_many_interim(self.pool.max_interim))
                raise _Stop
            self._interim = True
            headers.clear()
            return
        self._final = True
        resp.status = status
        self.keep_alive = self.parser.should_keep_alive()
        transport = self.transport
        if transport is not None and transport.get_write_buffer_size():
            # Answered before reading the whole request: the rest of it may be read as a next request.
            self._dirty = True
        if "content-length" in headers and "transfer-encoding" not in headers:  # the common answer: no call
            self._length_known = True
        else:  # chunked framing is the last coding's alone (RFC 9112 6.3): `notchunked` is not
            te = headers.get("transfer-encoding", "")
            self._length_known = te == "chunked" or te.rpartition(",")[2].strip().lower() == "chunked"
        if (status == 204 or status == 304) and (
            headers.get("content-length", "0") != "0" or "transfer-encoding" in headers
        ):
            # Framed as bodyless whatever it declares (RFC 9110 15.3.5, 15.4.5): a body the server sends
            # anyway, perhaps a moment later, would be read as the next request's answer.
            self._dirty = True
        encoding = headers.get("content-encoding")
        if encoding is not None:
            encoding = encoding.strip().lower()
            if encoding in ("gzip", "x-gzip"):
                resp._decoder = _Inflate(gzip=True)
            elif encoding == "deflate":
                resp._decoder = _Inflate(gzip=False)
        if self.headers_ready is not None and not self.headers_ready.done():
            self.headers_ready.set_result(None)

    def on_body(self, body: bytes) -> None:
        self._body_seen = True
        if self.response is not None:
            self.response._feed(body)

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
            return
        self._complete = True
        if self.response is not None:
            self.response._finish()

    # -- used by the pool and the response -------------------------------------------------------

    def _broken(self, exc: BaseException) -> None:
        if self.headers_ready is not None and not self.headers_ready.done():
            self.headers_ready.set_exception(exc)
        if self.response is not None:
            self.response._fail(exc)
        self.close()

    def pause(self) -> None:
        if not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.paused and self.transport is not None and not self.lost:
            self.paused = False
            self.transport.resume_reading()

    def close(self) -> None:
        self.keep_alive = False
        if self.transport is not None:
            self.transport.abort()

    def finished(self, reusable: bool) -> None:
        self.response = None
        self.headers_ready = None
        transport = self.transport
        if (
            reusable
            and self._complete
            and not self._dirty
            and self.keep_alive
            and not self.lost
            and transport is not None
            and not transport.is_closing()
            and not transport.get_write_buffer_size()
        ):
            self.resume()
            self.pool.put_back(self)
        else:
            self.close()
            self.pool.forget()

    def _watch_head(self, ready: asyncio.Future[None]) -> None:
        remaining = self._deadline - time.monotonic()
        if self._first_byte_s < remaining:
            self.watchdog.watch(ready, self._first_byte_s, "first_byte_timeout")
        else:
            self.watchdog.watch(ready, max(remaining, 0.0), "total_timeout")

    async def exchange(self, request: bytes, first_byte_s: float, deadline: float, max_body: int) -> Response:
        resp = Response(self, deadline, first_byte_s, max_body)
        self.response = resp
        self._final = self._interim = self._complete = self._dirty = False
        self._length_known = False
        self._gap = self._head_bytes = self._head_count = self._interims = 0
        ready = self.headers_ready = self.loop.create_future()
        assert self.transport is not None
        self.transport.write(request)
        self._first_byte_s, self._deadline = first_byte_s, deadline
        self._watch_head(ready)
        try:
            await ready
        except BaseException:
            resp._conn = None
            self.finished(reusable=False)
            del ready  # it holds the exception, whose traceback holds this frame: no cycle back to it
            raise
        return resp


__all__ = ["Pool", "_Connection"]
