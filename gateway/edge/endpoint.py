"""The completion endpoints as raw ASGI handlers, reached through `gateway.edge.app.Front`.

This is the hot path, so it skips Litestar's per-request machinery (router, exception middleware,
signature parsing, Response objects): it reads the body, hands it to the pipeline, and writes the
answer with two `send` calls, or relays a stream event by event. The lifespan and every other route
stay ordinary Litestar.

A client that disconnects cancels whatever is running for it: the upstream call before the answer
starts, or the relay of a stream (which closes the upstream connection).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any, Final

from litestar.types import HTTPResponseBodyEvent, HTTPResponseStartEvent, HTTPScope, Receive, Send

from gateway.edge.render import render
from gateway.ids import unique_suffix
from gateway.ops import accesslog
from gateway.ops.metrics import Metrics, Record
from gateway.path.dialects import Dialect
from gateway.path.operation import COMPLETIONS, Operation
from gateway.path.pipeline import STREAM_FAILED, Front, Pipeline, Result, release
from gateway.path.relay import STREAM_CUT, Held, shutdown_cut
from gateway.path.synonyms import as_sent
from gateway.server import DISCONNECT
from gateway.server.values import header_value
from wire.errors import GatewayError

log = logging.getLogger("gateway")

_JSON: Final = [(b"content-type", b"application/json")]
_SSE: Final = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]
_NO_LINES: Final[list[tuple[bytes, bytes]]] = []  # copied, never changed


def _start(status: int, headers: list[tuple[bytes, bytes]]) -> HTTPResponseStartEvent:
    return {"type": "http.response.start", "status": status, "headers": headers}


def _body(body: bytes, more: bool = False) -> HTTPResponseBodyEvent:
    return {"type": "http.response.body", "body": body, "more_body": more}


# Header names and values as sent, by their text. Nearly all of them repeat on every answer (the names, the
# provider, the model, the attempt count), and a dict probe costs a fraction of an encode plus the check.
# Emptied when full, so client-chosen model names cannot grow it; the request id, new on every answer and
# safe by construction (`request_id`), is encoded apart and never stored.
_ENCODED: Final[dict[str, bytes]] = {}
_ENCODED_MAX: Final = 1024


def _encoded(text: str) -> bytes:
    value = header_value(text)  # values can carry client text (the model in `x-gateway-model`)
    if len(_ENCODED) >= _ENCODED_MAX:
        _ENCODED.clear()
    _ENCODED[text] = value
    return value


def _encode_headers(
    headers: dict[str, str],
    rid: str | None = None,
    more: list[tuple[bytes, bytes]] | None = None,
    first: list[tuple[bytes, bytes]] = _NO_LINES,
) -> list[tuple[bytes, bytes]]:
    """A new list: `first` (the content type's lines), `headers`, then `more` (encoded already: the rate limits',
    a cached answer's), then the request id."""
    # A loop, not a comprehension: on Python 3.11 a comprehension is a function call of its own.
    get = _ENCODED.get
    encoded = first.copy()
    for k, v in headers.items():
        encoded.append((get(k) or _encoded(k), get(v) or _encoded(v)))
    if more is not None:
        encoded += more
    if rid is not None:
        encoded.append((b"x-request-id", rid.encode("ascii")))
    return encoded


async def _read_body(receive: Receive, message: Any = None) -> bytes:
    """The request's body; `message` is its first message when the caller has received it already."""
    # No limit here: `gateway.edge.app.Front` caps every route's body (`caps.request_body_bytes`) before this
    # runs, and its `receive` raises the 413 when a body without a declared length runs over.
    chunks: list[bytes] = []
    while True:
        if message is None:
            message = await receive()
        if message["type"] == "http.disconnect":
            raise asyncio.CancelledError
        chunk: bytes = message.get("body", b"")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)
        message = None


class _Watch:
    """Cancels the running phase of a request when its client disconnects.

    A phase runs in the request's own task, which the watcher cancels: a task per phase cost a task's
    creation, its steps and its wake-up of the request's task on every request. A server whose request
    task is not an asyncio task that can be cancelled (Granian's own scheduler) gets a task per phase."""

    __slots__ = ("armed", "gone", "owner", "task")

    def __init__(self, receive: Receive, scope: HTTPScope) -> None:
        self.gone = False
        owner = asyncio.current_task()
        self.owner = owner if type(owner) is asyncio.Task else None
        # The request's task while a phase runs (or the phase's own task): what a disconnect cancels.
        self.armed: asyncio.Future[Any] | None = None
        extensions: dict[str, Any] | None = scope.get("extensions")
        # A server may offer a function that takes a callback to call once if the client disconnects before
        # the answer is complete (gateway/server does): then no task waits on `receive` to learn it.
        subscribe: Callable[[Callable[[], None]], None] | None = extensions.get(DISCONNECT) if extensions else None
        if subscribe is not None:
            self.task: asyncio.Task[None] | None = None
            subscribe(self.left)
        else:
            # `create_task`, not `ensure_future`: four Python calls fewer for what is always a coroutine.
            self.task = asyncio.get_running_loop().create_task(self._watch(receive))

    async def _watch(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self.left()

    def left(self) -> None:
        self.gone = True
        if self.armed is not None:
            self.armed.cancel()

    async def run(self, work: Coroutine[Any, Any, Any]) -> Any:
        if self.gone:
            # The client left while nothing could be cancelled (between two phases): nothing more is started
            # for it, or a stream would be relayed to nobody until its upstream ended.
            work.close()
            raise asyncio.CancelledError
        if self.owner is None:
            self.armed = asyncio.get_running_loop().create_task(work)
            try:
                return await self.armed
            finally:
                self.armed = None
        # The watcher runs only while this task waits inside `work`: a cancel it makes lands there.
        self.armed = self.owner
        try:
            return await work
        finally:
            self.armed = None

    def stop(self) -> None:
        task = self.task
        if task is not None:
            # Let go of it: the task's end (its CancelledError's traceback) holds this watch, and the two would
            # be a cycle left to the collector at every request a server without `gateway.disconnect` serves.
            self.task = None
            task.cancel()


async def _relay(result: Result, send: Send) -> None:
    assert result.stream is not None
    stream = result.stream
    try:
        async for chunk in stream:
            # The event as a literal, not `_body`: a call fewer on every chunk of every stream.
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send(_body(b""))
    finally:
        await stream.aclose()  # type: ignore[attr-defined]


_REQUEST_ID: Final = re.compile(r"[A-Za-z0-9._:/+=-]{1,128}")


def joined(headers: dict[str, str], raw: Iterable[tuple[bytes, bytes]]) -> None:
    """Each header the client sent on several lines as one value, its lines' values joined by commas in the
    order sent (RFC 9110, section 5.3): `Cache-Control: no-cache` then `Cache-Control: max-age=5` read as
    `no-cache, max-age=5`, not as the last line alone."""
    lines: dict[str, list[str]] = {}
    for k, v in raw:
        lines.setdefault(k.decode("latin-1"), []).append(v.decode("latin-1"))
    for name, values in lines.items():
        if len(values) > 1:
            headers[name] = ", ".join(values)


def headers_of(scope: HTTPScope) -> dict[str, str]:
    """The request's headers by name for the routes off the hot path, each sent on several lines read whole
    (`joined`), as the completion routes read them: a key sent twice is one value, not its last line."""
    raw = scope["headers"]
    headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in raw}
    if len(headers) < len(raw):  # type: ignore[arg-type]  # a list, by the ASGI spec
        joined(headers, raw)
    return headers


def request_id(headers: dict[str, str]) -> str:
    """The client's `x-request-id` when it is a sane token (it is echoed and logged), else a new one."""
    given = headers.get("x-request-id")
    if given and _REQUEST_ID.fullmatch(given):
        return given
    return "req_" + unique_suffix()


async def _send_error(send: Send, dialect: Dialect, exc: GatewayError, rid: str | None = None) -> None:
    status, headers, body = render(dialect, exc)
    await send(_start(status, _encode_headers(headers, rid, first=_JSON)))
    await send(_body(body))


Services = Callable[[HTTPScope], tuple[Pipeline, Metrics | None]]
Endpoint = Callable[[HTTPScope, Receive, Send], Awaitable[None]]


def completion_endpoint(path: str, dialect: Dialect, services: Services, op: Operation = COMPLETIONS) -> Endpoint:
    async def endpoint(scope: HTTPScope, receive: Receive, send: Send) -> None:
        if scope["method"] != "POST":
            exc = GatewayError(
                "Method Not Allowed", status=405, type="invalid_request_error", code="method_not_allowed"
            )
            await _send_error(send, dialect, exc)
            return
        t0 = time.perf_counter()
        headers: dict[str, str] = {}
        raw_headers = scope["headers"]
        for k, v in raw_headers:  # a loop, not a comprehension (a call of its own on Python 3.11)
            headers[k.decode("latin-1")] = v.decode("latin-1")
        if len(headers) < len(raw_headers):  # type: ignore[arg-type]  # a list, by the ASGI spec
            joined(headers, raw_headers)  # a header sent on several lines, read whole
        rec = Record(request_id=request_id(headers), dialect=dialect.name, endpoint=op.name)
        pipeline, metrics = services(scope)
        try:
            message = await receive()
            if message["type"] == "http.request" and not message.get("more_body", False):
                body: bytes = message.get("body", b"")  # the whole body in one message: no coroutine
            else:
                body = await _read_body(receive, message)
        except GatewayError as exc:
            await _send_error(send, dialect, exc, rec.request_id)
            return
        except asyncio.CancelledError:
            return  # the client left while sending its body
        if pipeline.retiring:
            # A reload while a slow client was sending its body retired this pipeline: the new one serves it.
            pipeline, metrics = services(scope)
        pipeline.enter()
        if metrics is not None:
            metrics.started()
        # The request's server span, when tracing is on; it ends with the answer or the stream.
        tracer = pipeline.tracing
        span = tracer.begin(headers, dialect.name, path, pipeline.trace_link, op.genai) if tracer is not None else None
        # Made when something is awaited that a client leaving should cancel: a cached answer served by
        # `early` awaits nothing but its own sends, and costs no watcher task.
        watch: _Watch | None = None
        front: Front | None = None
        result: Result | None = None
        started = False
        held: Held | None = None
        try:
            if pipeline.cache is not None:
                early = pipeline.early(body, headers, rec, op, dialect)
                if isinstance(early, Result):
                    result = early
                else:
                    front = early
            if result is None:
                watch = _Watch(receive, scope)
                result = await watch.run(pipeline.complete(body, headers, dialect, rec, front, op))
            started = True
            held = result.held
            if result.stream is None:
                # The events as literals, not `_start` and `_body`: two calls fewer on every answer.
                headers_out = _encode_headers(result.headers, rec.request_id, result.limits, _JSON)
                # Its length, so that no server frames it in chunks, and the head needs no wait for its framing.
                headers_out.append((b"content-length", b"%d" % len(result.body)))
                await send({"type": "http.response.start", "status": 200, "headers": headers_out})
                await send({"type": "http.response.body", "body": result.body, "more_body": False})
                return
            await send(_start(200, _encode_headers(result.headers, rec.request_id, result.limits, _SSE)))
            if watch is None:
                watch = _Watch(receive, scope)
            await watch.run(_relay(result, send))
        except GatewayError as exc:
            if exc.param is not None:
                exc = as_sent(exc, body)  # a folded field, named as the client sent it
            rec.status, rec.error_code, rec.cause = dialect.error(exc)[0], exc.code, exc.cause
            rec.attempts = exc.attempts or rec.attempts
            if exc.target is not None and not rec.provider:  # the log line and the metrics name what failed
                rec.provider, rec.target, rec.failed = exc.provider or "", exc.target, True
            if not started:
                await _send_error(send, dialect, exc, rec.request_id)
        except asyncio.CancelledError:
            if front is not None:
                release(front)  # cancelled perhaps before `complete` ran, which releases it otherwise
            # A stream whose upstream failed was booked as that failure before the client left or the drain
            # deadline cut it (while its error event was being sent): the failure came first, and stays.
            booked = started and rec.error_code is not None
            if watch is not None and watch.gone:
                if not booked:
                    rec.status, rec.error_code = 499, "client_closed_request"
            else:
                # Not the client leaving: the server cut the request at its drain deadline. One line says so
                # (a re-raise would make the server log a traceback), and the client is told, not left hanging.
                cut = shutdown_cut()
                if not booked:
                    rec.status, rec.error_code = cut.status, cut.code
                log.warning(
                    "request %s cut at the drain deadline (server.shutdown_grace_ms): %s",
                    rec.request_id,
                    "the stream ended with an error event" if started else "answered 503",
                )
                with contextlib.suppress(Exception):
                    if not started:
                        await _send_error(send, dialect, cut, rec.request_id)
                    elif result is not None and result.stream is not None and not booked:
                        await send(_body(STREAM_CUT))  # not a second error event after the failure's
        except Exception:
            # Never a traceback or an internal message to the client; the log keeps the detail.
            log.exception("unhandled error on %s (request %s)", path, rec.request_id)
            rec.status, rec.error_code = 500, "internal_error"
            if not started:
                await _send_error(
                    send,
                    dialect,
                    GatewayError("The gateway failed to process the request", code="internal_error"),
                    rec.request_id,
                )
            elif result is not None and result.stream is not None:
                # A stream the client saw start still ends with an error event and [DONE].
                with contextlib.suppress(Exception):
                    await send(_body(STREAM_FAILED))
        finally:
            if watch is not None:
                watch.stop()
            if held is not None and not held.taken:
                # The relay never began (the client left right after the response started, or `send` failed):
                # what the stream holds is given back here. A second cancel (the drain deadline) must not
                # skip the bookkeeping below.
                with contextlib.suppress(asyncio.CancelledError):
                    await held.release()
            pipeline.usage.book(rec)  # before exit(): a retired pipeline drains its bookings as it closes
            pipeline.exit()
            elapsed = time.perf_counter() - t0
            if metrics is not None:
                metrics.ended()
                metrics.observe(rec, elapsed)
            if pipeline.log_requests:
                accesslog.write(rec, elapsed)
            if pipeline.ledger is not None:
                pipeline.ledger.append(rec, elapsed)  # after usage.book, which priced it
            if span is not None:
                span.end(rec)

    endpoint.__name__ = f"{op.name}_{dialect.name}_{len(path)}"
    return endpoint


# The other raw routes (gateway/edge/tokenizer_routes.py) read and answer the same way.
read_body = _read_body
send_error = _send_error
Watch = _Watch


async def send_json(send: Send, status: int, body: bytes, headers: dict[str, str]) -> None:
    await send(_start(status, _encode_headers(headers, first=_JSON)))
    await send(_body(body))


__all__ = [
    "Endpoint",
    "Watch",
    "completion_endpoint",
    "headers_of",
    "read_body",
    "request_id",
    "send_error",
    "send_json",
]
