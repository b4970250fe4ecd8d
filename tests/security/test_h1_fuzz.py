"""Property-based fuzzing of raw upstream answers against gateway/upstream/h1.py, over a real loopback socket.

Hypothesis builds an answer from parts a hostile or broken upstream could send: interim 1xx answers,
valid and broken status lines, duplicate or conflicting Content-Length, Content-Length with
Transfer-Encoding, chunk extensions and trailers, obs-fold, bare LF and CR, NUL, huge or too many headers,
gzip / deflate / raw deflate bodies and bombs, bytes after the message, early closes and trickles. A raw
asyncio server sends exactly those bytes. Whatever they are, the client must:

- end within its timeouts (each example has a wall-clock budget a little over `total_s`);
- return nothing over its caps (a buffered body at most `max_body`, relayed decoded pieces bounded);
- give a well-formed answer's exact body back, and refuse what is not HTTP with its own exceptions;
- never pool a connection with unread bytes: after each case, follow-up requests on the same client
  each get their own answer (a server that closes an idle connection may make one `Disconnected`).

Bounded for CI: 200 examples, no shrinking-time surprises (`deadline=None`, a per-example timeout).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from typing import Final

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.upstream import h1
from tests.security.test_h1_pool import own, read_request

KiB: Final = 1024
MAX_BODY: Final = 256 * KiB
MAX_HEAD: Final = 8 * KiB
MAX_HEADERS: Final = 40
FIRST_BYTE_S: Final = 0.8
TOTAL_S: Final = 1.5
# How long the server keeps an idle connection open, shorter than the client's timeouts: a client
# still waiting for bytes that never come sees a close, not its timeout, and examples stay quick.
SERVER_IDLE_S: Final = 0.3


class Case:
    """One generated answer (a plain class: Hypothesis pretty-prints dataclasses field by field)."""

    __slots__ = ("pieces", "close", "expected", "stream")

    def __init__(
        self, pieces: tuple[tuple[bytes, float], ...], close: bool, expected: bytes | None, stream: bool
    ) -> None:
        self.pieces = pieces  # bytes sent, then a pause before the next piece
        self.close = close  # the server closes after the last piece (else it serves further requests on it)
        self.expected = expected  # the body a correct client returns, when the answer is well-formed
        self.stream = stream  # read with iter_chunks() instead of read()

    def __repr__(self) -> str:
        # Bombs and huge bodies would make a falsifying example unreadable (and Hypothesis warns).
        shown = [(p[:200] + (b"...%d bytes" % len(p) if len(p) > 200 else b""), d) for p, d in self.pieces]
        expected = None if self.expected is None else self.expected[:100]
        return f"Case(pieces={shown!r}, close={self.close}, expected={expected!r}, stream={self.stream})"


def _deflate(data: bytes, wbits: int) -> bytes:
    z = zlib.compressobj(6, zlib.DEFLATED, wbits)
    return z.compress(data) + z.flush()


# A bomb: 64 MiB of zeros, about 64 KB compressed; built once.
_BOMB: Final = (lambda z: b"".join(z.compress(bytes(MAX_BODY)) for _ in range(256)) + z.flush())(
    zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
)

ENCODINGS: Final[dict[str, tuple[bytes | None, Callable[[bytes], bytes]]]] = {
    "identity": (None, lambda b: b),
    "gzip": (b"gzip", lambda b: _deflate(b, 16 + zlib.MAX_WBITS)),
    "deflate": (b"deflate", lambda b: _deflate(b, zlib.MAX_WBITS)),
    "raw-deflate": (b"deflate", lambda b: _deflate(b, -zlib.MAX_WBITS)),
    "bomb": (b"gzip", lambda b: _BOMB),
}
INTERIMS: Final = [
    b"HTTP/1.1 100 Continue\r\n\r\n",
    b"HTTP/1.1 102 Processing\r\n\r\n",
    b"HTTP/1.1 103 Early Hints\r\nlink: </a.css>; rel=preload\r\n\r\n",
]
# (line, whether a correct client accepts it)
STATUS_LINES: Final = [
    (b"HTTP/1.1 200 OK\r\n", True),
    (b"HTTP/1.1 200 \r\n", True),
    (b"HTTP/1.0 200 OK\r\n", True),
    (b"HTTP/1.1 500 Internal Server Error\r\n", True),
    (b"HTTP/1.1 429 Too Many Requests\r\n", True),
    (b"HTTP/1.1 204 No Content\r\n", True),
    (b"HTTP/1.1 304 Not Modified\r\n", True),
    (b"HTTP/1.1 101 Switching Protocols\r\n", False),
    (b"HTTP/1.1 150 Odd\r\n", False),
    (b"HTTP/1.1 099 Low\r\n", False),
    (b"HTTP/1.1 200 OK\n", False),
    (b"HTTP/1.1 200 OK\r", False),
    (b"HTTP/2 200\r\n", False),
    (b"ICY 200 OK\r\n", False),
    (b"garbage\r\n", False),
    (b"HTTP/1.1 2000 OK\r\n", False),
]
# (header lines, whether a correct client accepts them)
ODD_HEADERS: Final = [
    (b"", True),
    (b"x-a: 1\r\nx-a: 2\r\n", True),
    (b"x-fold: 1\r\n folded\r\n", False),
    (b"x-bare: 1\nx-b: 2\r\n", False),
    (b"x-nul: a\x00b\r\n", False),
    (b"bad header: 1\r\n", False),
    (b"x-huge: " + b"h" * (MAX_HEAD + 1) + b"\r\n", False),
    (b"".join(b"x-%d: 1\r\n" % i for i in range(MAX_HEADERS + 1)), False),
    (b"content-length: 1\r\n", False),  # conflicts with (or duplicates) the framing below
    (b"transfer-encoding: chunked\r\n", False),
]
EXTRAS: Final = [b"", b"", b"\r\n", b"HTTP/1.1 200 OK\r\ncontent-length: 6\r\n\r\nstolen", b"\x00junk", b"0\r\n\r\n"]


@st.composite
def cases(draw: st.DrawFn) -> Case:
    body = draw(st.binary(max_size=3000) | st.just(b"x" * (MAX_BODY + 1)))
    encoding = draw(st.sampled_from(sorted(ENCODINGS)))
    coding, encode = ENCODINGS[encoding]
    wire = encode(body)
    framing = draw(st.sampled_from(["length", "chunked", "close", "short-length", "long-length"]))
    status, status_ok = draw(st.sampled_from(STATUS_LINES))
    odd, odd_ok = draw(st.sampled_from(ODD_HEADERS))
    interims = draw(st.lists(st.sampled_from(INTERIMS), max_size=3))
    keep_open = draw(st.booleans())
    connection_close = draw(st.booleans())

    head = bytearray(b"".join(interims) + status + odd)
    if coding is not None:
        head += b"content-encoding: " + coding + b"\r\n"
    if connection_close:
        head += b"connection: close\r\n"
    if framing == "chunked":
        head += b"transfer-encoding: chunked\r\n\r\n"
        size = draw(st.integers(1, 4096))
        ext = draw(st.sampled_from([b"", b";ext=1", b';name="quoted"']))
        framed = b"".join(b"%x%s\r\n%s\r\n" % (len(p), ext, p) for p in _pieces(wire, size))
        trailer = draw(st.sampled_from([b"", b"x-trailer: 1\r\n", b"x-t: " + b"t" * (MAX_HEAD + 1) + b"\r\n"]))
        framed += b"0\r\n" + trailer + b"\r\n"
        chunked_ok = len(trailer) < MAX_HEAD
    else:
        chunked_ok = True
        declared = {"length": len(wire), "close": None, "short-length": max(len(wire) - 1, 0)}.get(
            framing, len(wire) + 1
        )
        if declared is not None:
            head += b"content-length: %d\r\n" % declared
        head += b"\r\n"
        framed = wire
    extra = draw(st.sampled_from(EXTRAS))
    raw = bytes(head) + framed + extra
    status_code = int(status[9:12]) if status_ok else 0
    no_body = status_code in (204, 304)

    # Deliver it in pieces, some after a pause; sometimes cut short. Pauses fall inside the message only:
    # bytes after its end arrive with its last piece. (Bytes a server sends after an answer ended, once
    # the client has reused the connection, cannot be told from the next answer by any HTTP/1.1 client.)
    end = len(head) if no_body else len(head) + len(framed)
    if framing == "short-length" and not no_body:
        end = len(head) + max(len(wire) - 1, 0)
    cuts = sorted(draw(st.lists(st.integers(0, max(end - 1, 0)), max_size=4)))
    delays = draw(st.lists(st.sampled_from([0.0, 0.0, 0.001, 0.02]), min_size=len(cuts) + 1, max_size=len(cuts) + 1))
    cut_short = draw(st.sampled_from([None, None, None, len(head), len(head) + 1, len(raw) // 2]))
    if cut_short is not None:
        raw = raw[:cut_short]
    bounds = [0, *cuts, len(raw)]
    pieces = tuple((raw[a:b], d) for (a, b), d in zip(itertools.pairwise(bounds), delays, strict=False) if b > a)

    closes = not keep_open
    well_formed = (
        status_ok
        and odd_ok
        and chunked_ok
        and cut_short is None
        and (framing in ("length", "chunked") or (framing == "close" and closes) or no_body)
        and encoding != "bomb"
    )
    expected: bytes | None = None
    if well_formed:
        expected = b"" if no_body else body
        if len(expected) > MAX_BODY:
            expected = None
    return Case(pieces=pieces, close=closes, expected=expected, stream=draw(st.booleans()))


def _pieces(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)] or []


class Server:
    """A raw loopback server on its own loop and thread: `case:<n>` gets case n's bytes, anything else
    its own answer, on any connection, until the connection idles for SERVER_IDLE_S."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="h1-fuzz")
        self.cases: dict[bytes, Case] = {}
        self.url = ""
        self._server: asyncio.Server | None = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                async with asyncio.timeout(SERVER_IDLE_S):
                    _, body = await read_request(reader)
                case = self.cases.get(body)
                if case is None:
                    writer.write(own(body))
                    await writer.drain()
                    continue
                for piece, pause in case.pieces:
                    writer.write(piece)
                    await writer.drain()
                    if pause:
                        await asyncio.sleep(pause)
                if case.close:
                    return
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError, ValueError):
            pass
        finally:
            writer.close()

    def run(self, coro: object, timeout: float) -> object:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)  # type: ignore[arg-type]

    def __enter__(self) -> Server:
        self.thread.start()

        async def start() -> None:
            self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
            self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}/v1/completions"

        self.run(start(), 5)
        return self

    def __exit__(self, *exc: object) -> None:
        async def stop() -> None:
            assert self._server is not None
            self._server.close()
            # Handlers still pausing between pieces would otherwise be destroyed pending when the loop
            # closes, and their warnings land in whichever test the collector runs next.
            handlers = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in handlers:
                task.cancel()
            await asyncio.gather(*handlers, return_exceptions=True)
            with contextlib.suppress(Exception):
                async with asyncio.timeout(1):
                    await self._server.wait_closed()

        with contextlib.suppress(Exception):
            self.run(stop(), 5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        if not self.loop.is_running():
            self.loop.close()


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with Server() as srv:
        yield srv


_ids = itertools.count()
ERRORS: Final = (h1.Malformed, h1.Disconnected, TimeoutError)


async def exchange(client: h1.Client, url: str, body: bytes, stream: bool) -> bytes:
    resp = await client.request("POST", url, {}, body, connect_s=1.0, first_byte_s=FIRST_BYTE_S, total_s=TOTAL_S)
    try:
        if not stream:
            got = await resp.read()
            assert len(got) <= MAX_BODY
            return got
        out = bytearray()
        async for chunk in resp.iter_chunks():
            # One socket read at most (256 KiB), and a decoded piece at most 64 KiB.
            assert len(chunk) <= (64 * KiB if "content-encoding" in resp.headers else 256 * KiB)
            out += chunk
            if len(out) > 4 * MAX_BODY:
                break  # a relayed bomb: the reader stops taking, the connection is closed
        return bytes(out)
    finally:
        resp.release()


async def run_case(url: str, case_body: bytes, case: Case) -> None:
    client = h1.Client(2, max_body=MAX_BODY, max_header_bytes=MAX_HEAD, max_headers=MAX_HEADERS)
    try:
        try:
            got: bytes | BaseException = await exchange(client, url, case_body, case.stream)
        except ERRORS as exc:
            got = exc
        if case.expected is not None:
            assert got == case.expected, (type(got), case)
        # Follow-ups on the same client: each must get its own answer, never bytes left from the case.
        for i in range(3):
            tag = b"follow-%d-%s" % (i, case_body)
            for attempt in range(3):
                try:
                    assert await exchange(client, url, tag, stream=i % 2 == 1) == b"answer to " + tag
                    break
                except h1.Disconnected:
                    # A pooled connection the server closed when idle: the failover loop would retry.
                    assert attempt < 2
    finally:
        client.close()


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
    derandomize=True,
)
@given(case=cases())
def test_any_answer_ends_in_time_within_caps_and_never_desyncs_the_pool(server: Server, case: Case) -> None:
    body = b"case:%d" % next(_ids)
    server.cases[body] = case
    started = time.monotonic()
    try:
        # Case, then three follow-ups: each bounded by TOTAL_S; the budget adds slack for a loaded machine.
        server.run(run_case(server.url, body, case), timeout=4 * TOTAL_S + 3)
    finally:
        del server.cases[body]
    assert time.monotonic() - started < 4 * TOTAL_S + 3
