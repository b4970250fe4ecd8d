"""A catalogue of hostile upstream behaviours, and a raw loopback server that performs them byte for byte.

No HTTP framework would send most of these (a 204 with a body, two Content-Lengths, a bare CR), so
the server is a plain asyncio stream server: it reads each request's head and body, and answers a
request carrying `x-case: <name>` with that case's script, verbatim; any other request gets an honest
answer naming it (`{"n": <x-req>}`). After a script that leaves the connection open the server keeps
reading requests on it, so bytes a case smuggles after its answer are still there for the next request
that reuses the connection: exactly what a desynchronised pool would hand to another tenant.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import socket
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class Close:
    """Close the connection (FIN)."""


@dataclass(frozen=True)
class Reset:
    """Abort the connection (RST)."""


@dataclass(frozen=True)
class Wait:
    seconds: float


Step = bytes | Close | Reset | Wait
Outcome = Literal["ok", "error"]


@dataclass(frozen=True)
class Case:
    name: str
    script: Sequence[Step]
    # What RFC 9112 says the gateway should make of it: ("ok", status, body), ("error", gateway error class
    # name), or None when either reading is allowed and the test only requires the transports to agree.
    expect: tuple[str, int, bytes] | tuple[str, str] | None
    why: str = ""
    # Seconds to wait before the follow-up requests (a case whose bytes arrive while the connection idles).
    pause: float = 0.0
    # The first follow-up may fail with "closed the connection": it raced the server's close, which a
    # client cannot see coming (a completion is not idempotent, so neither transport resends it).
    race: bool = False
    # Set when RFC 9112 allows the two transports to differ here; says why. Both must still be safe.
    divergence: str = ""
    # `expect` holds for buffered reads only: caps.upstream_body_bytes bounds a buffered body, while a relayed
    # stream is decoded 64 KiB at a time and bounded per event by the stream decoder (caps.upstream_event_bytes).
    buffered_only: bool = False


BODY = b'{"ok":1}'
CRLF = b"\r\n"


def head(status: str = "200 OK", *lines: str, version: str = "HTTP/1.1") -> bytes:
    return (f"{version} {status}\r\n" + "".join(f"{line}\r\n" for line in lines) + "\r\n").encode("latin-1")


def ok(body: bytes = BODY, *extra: str) -> bytes:
    return head("200 OK", "content-type: application/json", f"content-length: {len(body)}", *extra) + body


def chunked(*pieces: bytes, ext: str = "", trailer: bytes = b"") -> bytes:
    out = b"".join(f"{len(p):x}{ext}\r\n".encode() + p + CRLF for p in pieces)
    return out + b"0\r\n" + trailer + CRLF


def trickle(data: bytes, gap: float) -> list[Step]:
    steps: list[Step] = []
    for i in range(len(data)):
        steps += [data[i : i + 1], Wait(gap)]
    return steps


def _bomb(kind: str, size: int) -> bytes:
    zeros = b"\0" * size
    if kind == "gzip":
        return gzip.compress(zeros, 9)
    return zlib.compress(zeros, 9)


# The differential config's body cap (caps.upstream_body_bytes); the bombs decode to 16 times more.
BODY_CAP = 1024 * 1024
HEADER_CAP = 64 * 1024  # caps.upstream_header_bytes, its default
GZIP_BOMB = _bomb("gzip", 16 * BODY_CAP)
DEFLATE_BOMB = _bomb("deflate", 16 * BODY_CAP)
SMUGGLED = head("200 OK", "content-length: 10") + b'{"n":666}\n'
RAW_DEFLATE = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
_RAW = RAW_DEFLATE.compress(BODY) + RAW_DEFLATE.flush()

# About 4 KiB of interim answers with a header field each.
EARLY_HINTS = head("103 Early Hints", "link: </style.css>; rel=preload") * 64

CONNECT = "UpstreamConnectError"
CAP = "UpstreamError"  # over a caps.* limit: 502 naming the cap, not retried
TIMEOUT = "UpstreamTimeoutError"

CASES: list[Case] = [
    # -- well-formed, as a baseline -------------------------------------------------------------------
    Case("plain_content_length", [ok()], ("ok", 200, BODY)),
    Case(
        "plain_chunked", [head("200 OK", "transfer-encoding: chunked") + chunked(b'{"ok"', b":1}")], ("ok", 200, BODY)
    ),
    Case("error_status_with_body", [head("503 Busy", "content-length: 4") + b"busy"], ("ok", 503, b"busy")),
    Case("reason_phrase_empty", [b"HTTP/1.1 200 \r\ncontent-length: 8\r\n\r\n" + BODY], ("ok", 200, BODY)),
    Case("chunked_capitalised", [head("200 OK", "Transfer-Encoding: Chunked") + chunked(BODY)], ("ok", 200, BODY)),
    # -- interim answers (RFC 9110 15.2: a client MUST be able to parse and ignore them) -----------------
    Case("interim_100", [head("100 Continue") + ok()], ("ok", 200, BODY), "an interim answer is not the answer"),
    Case("interim_103", [head("103 Early Hints", "link: </a>; rel=preload") + ok()], ("ok", 200, BODY)),
    Case(
        "interim_100_twice_apart",
        [head("100 Continue"), Wait(0.05), head("100 Continue"), Wait(0.05), ok()],
        ("ok", 200, BODY),
    ),
    Case(
        "interim_ten",
        [head("100 Continue") * 9, Wait(0.01), head("103 Early Hints", "link: </a>; rel=preload") + ok()],
        ("ok", 200, BODY),
        "as many interim answers as caps.upstream_interim_answers lets through",
    ),
    Case(
        "interim_eleven",
        [head("100 Continue") * 6, Wait(0.01), head("100 Continue") * 5 + ok()],
        ("error", CAP),
        "one interim answer more than caps.upstream_interim_answers, split between two reads",
    ),
    Case(
        "interim_flood",
        [head("100 Continue") * 160, Wait(0.005)] * 600,
        ("error", CAP),
        "interim answers without end, none of them late: refused at caps.upstream_interim_answers, not at total_ms",
    ),
    Case(
        "interim_flood_with_fields",
        [EARLY_HINTS, Wait(0.005)] * 600,
        ("error", CAP),
        "refused at caps.upstream_interim_answers, before their fields reach h1.MAX_HEADERS or their bytes the cap",
    ),
    Case(
        "switching_protocols_101",
        [head("101 Switching Protocols", "upgrade: websocket", "connection: upgrade") + b"\x81\x05hello"],
        ("error", CONNECT),
        "the gateway never asked to upgrade: a 101 is a broken answer, and nothing after it is HTTP",
    ),
    # -- bodies where none may be (RFC 9112 6.3 rule 1) -------------------------------------------------
    Case("no_content_204_with_body", [head("204 No Content", "content-length: 5") + b"hello"], ("ok", 204, b"")),
    Case("not_modified_304_with_body", [head("304 Not Modified", "content-length: 8") + BODY], ("ok", 304, b"")),
    Case("no_content_204_smuggling", [head("204 No Content") + SMUGGLED], ("ok", 204, b"")),
    Case(
        "no_content_204_body_later",
        [head("204 No Content", f"content-length: {len(SMUGGLED)}"), Wait(0.05), SMUGGLED],
        ("ok", 204, b""),
        "a 204 that declares a body must not be pooled: the body, sent a moment later, would answer the next request",
    ),
    Case(
        "not_modified_304_chunked_later",
        [head("304 Not Modified", "transfer-encoding: chunked"), Wait(0.05), SMUGGLED],
        ("ok", 304, b""),
    ),
    # -- Content-Length and Transfer-Encoding (RFC 9112 6.1-6.3) ---------------------------------------
    Case(
        "content_length_duplicate_equal",
        [head("200 OK", "content-length: 8", "content-length: 8") + BODY],
        None,
        divergence="RFC 9112 6.3 lets a recipient refuse equal duplicates or fold them into one: llhttp refuses, h11 "
        "folds them before the wrapper can see them. Either way the length is unambiguous.",
    ),
    Case(
        "content_length_conflicting",
        [head("200 OK", "content-length: 8", "content-length: 9") + BODY + b" "],
        ("error", CONNECT),
    ),
    Case(
        "content_length_list",
        [head("200 OK", "content-length: 8, 8") + BODY],
        None,
        divergence="as content_length_duplicate_equal: a list of one repeated value, refused or folded",
    ),
    Case(
        "content_length_with_chunked",
        [head("200 OK", "content-length: 3", "transfer-encoding: chunked") + chunked(BODY)],
        ("error", CONNECT),
        "RFC 9112 6.3 rule 3: may indicate smuggling and ought to be handled as an error",
    ),
    Case("content_length_negative", [head("200 OK", "content-length: -1") + BODY], ("error", CONNECT)),
    Case("content_length_huge", [head("200 OK", "content-length: 99999999999999999999999") + BODY], ("error", CONNECT)),
    Case("content_length_not_a_number", [head("200 OK", "content-length: 8x") + BODY], ("error", CONNECT)),
    Case("content_length_plus_sign", [head("200 OK", "content-length: +8") + BODY], ("error", CONNECT)),
    Case(
        "chunk_extensions",
        [head("200 OK", "transfer-encoding: chunked") + chunked(BODY, ext=';a=1;b="x y"')],
        ("ok", 200, BODY),
    ),
    Case(
        "chunk_trailers",
        [head("200 OK", "transfer-encoding: chunked") + chunked(BODY, trailer=b"x-trailer: 1\r\n")],
        ("ok", 200, BODY),
    ),
    Case(
        "chunk_size_overflow",
        [head("200 OK", "transfer-encoding: chunked") + b"FFFFFFFFFFFFFFFFFFFF\r\n" + BODY],
        ("error", ""),
        divergence="a 20-digit chunk size: llhttp refuses the overflow (502); h11 takes it and waits for that many "
        "bytes until the read timeout (504). Both fail the attempt and close the connection.",
    ),
    Case(
        "chunk_size_not_hex",
        [head("200 OK", "transfer-encoding: chunked") + b"zz\r\n" + BODY + b"\r\n0\r\n\r\n"],
        ("error", CONNECT),
    ),
    Case(
        "chunk_size_negative",
        [head("200 OK", "transfer-encoding: chunked") + b"-8\r\n" + BODY + b"\r\n0\r\n\r\n"],
        ("error", CONNECT),
    ),
    Case(
        "chunk_data_longer_than_size",
        [head("200 OK", "transfer-encoding: chunked") + b"2\r\n" + BODY + b"\r\n0\r\n\r\n"],
        ("error", CONNECT),
    ),
    # -- header syntax (RFC 9112 2.2, 5) ----------------------------------------------------------------
    Case(
        "obs_fold",
        [b"HTTP/1.1 200 OK\r\nx-folded: a\r\n b\r\ncontent-length: 8\r\n\r\n" + BODY],
        None,
        divergence="RFC 9112 5.2 lets a gateway either refuse obs-fold (502) or unfold it: llhttp refuses, h11 unfolds",
    ),
    Case(
        "bare_lf_line_ends",
        [b"HTTP/1.1 200 OK\ncontent-length: 8\n\n" + BODY],
        None,
        divergence="RFC 9112 2.2: a recipient MAY take a bare LF as a line end: h11 does, llhttp (strict) does not",
    ),
    Case(
        "bare_cr_line_ends",
        [b"HTTP/1.1 200 OK\rcontent-length: 8\r\r" + BODY],
        ("error", ""),
        divergence="RFC 9112 2.2: bare CR is invalid. llhttp refuses it at once (502); h11 never sees a line end "
        "and waits for one until the first-byte timeout (504). Both fail the attempt and close the connection.",
    ),
    Case("bare_cr_in_value", [b"HTTP/1.1 200 OK\r\nx-a: a\rb\r\ncontent-length: 8\r\n\r\n" + BODY], ("error", CONNECT)),
    Case(
        "nul_in_header_value", [b"HTTP/1.1 200 OK\r\nx-a: a\0b\r\ncontent-length: 8\r\n\r\n" + BODY], ("error", CONNECT)
    ),
    Case("space_before_colon", [b"HTTP/1.1 200 OK\r\ncontent-length : 8\r\n\r\n" + BODY], ("error", CONNECT)),
    Case(
        "header_without_colon",
        [b"HTTP/1.1 200 OK\r\nbogus header line\r\ncontent-length: 8\r\n\r\n" + BODY],
        ("error", CONNECT),
    ),
    Case(
        "oversized_header",
        [head("200 OK", "x-big: " + "a" * (HEADER_CAP + 4096), "content-length: 8") + BODY],
        ("error", CAP),
    ),
    Case(
        "huge_header",
        [head("200 OK", "x-big: " + "a" * (4 * HEADER_CAP), "content-length: 8") + BODY],
        ("error", CAP),
    ),
    Case(
        "too_many_headers",
        [head("200 OK", *[f"x-h{i}: v" for i in range(HEADER_CAP // 8)], "content-length: 8") + BODY],
        ("error", CAP),
    ),
    Case(
        "headers_over_count_under_bytes",
        [head("200 OK", *[f"x-h{i}: v" for i in range(300)], "content-length: 8") + BODY],
        ("error", CAP),
        "at most 200 header fields (h1.MAX_HEADERS), however small",
    ),
    Case(
        "many_small_headers_under_cap",
        [head("200 OK", *[f"x-h{i}: v" for i in range(150)], "content-length: 8") + BODY],
        ("ok", 200, BODY),
    ),
    # -- status lines ------------------------------------------------------------------------------------
    Case("status_not_a_number", [b"HTTP/1.1 abc OK\r\ncontent-length: 8\r\n\r\n" + BODY], ("error", CONNECT)),
    Case("not_http_at_all", [b"SSH-2.0-OpenSSH_9.2\r\n\r\n"], ("error", CONNECT)),
    Case("http_1_0_with_length", [head("200 OK", "content-length: 8", version="HTTP/1.0") + BODY], ("ok", 200, BODY)),
    Case("http_1_0_close_delimited", [head("200 OK", version="HTTP/1.0") + BODY, Close()], ("ok", 200, BODY)),
    Case(
        "http_2_status_line",
        [head("200 OK", "content-length: 8", version="HTTP/2.0") + BODY],
        None,
        "both read it as 1.x",
    ),
    # -- compression -------------------------------------------------------------------------------------
    Case("gzip_body", [ok(gzip.compress(BODY), "content-encoding: gzip")], ("ok", 200, BODY)),
    Case("deflate_body", [ok(zlib.compress(BODY), "content-encoding: deflate")], ("ok", 200, BODY)),
    Case(
        "raw_deflate_body",
        [ok(_RAW, "content-encoding: deflate")],
        ("ok", 200, BODY),
        "deflate is meant to be zlib-wrapped (RFC 9110 8.4.1.2); both tell a raw stream by its first two bytes",
    ),
    Case("gzip_garbage", [ok(b"\x1f\x8b\x08\x00garbage-not-gzip", "content-encoding: gzip")], ("error", CONNECT)),
    Case(
        "gzip_bomb",
        [ok(GZIP_BOMB, "content-encoding: gzip")],
        ("error", CAP),
        "16 MiB decoded, over the 1 MiB cap",
        buffered_only=True,
    ),
    Case("deflate_bomb", [ok(DEFLATE_BOMB, "content-encoding: deflate")], ("error", CAP), buffered_only=True),
    Case(
        "content_length_over_cap",
        [head("200 OK", f"content-length: {BODY_CAP + 1}"), Wait(30)],
        ("error", CAP),
        buffered_only=True,
    ),
    Case("body_over_cap", [ok(b"x" * (BODY_CAP + 1))], ("error", CAP), buffered_only=True),
    # -- where the body ends ------------------------------------------------------------------------------
    Case("close_delimited", [head("200 OK", "connection: close") + BODY, Close()], ("ok", 200, BODY)),
    Case("close_delimited_no_header", [head("200 OK") + BODY, Close()], ("ok", 200, BODY)),
    Case("close_before_anything", [Close()], ("error", CONNECT)),
    Case("reset_before_anything", [Reset()], ("error", CONNECT)),
    Case("close_mid_status_line", [b"HTTP/1.1 20", Close()], ("error", CONNECT)),
    Case("close_mid_headers", [b"HTTP/1.1 200 OK\r\ncontent-le", Close()], ("error", CONNECT)),
    Case("close_mid_body", [head("200 OK", "content-length: 100") + BODY, Close()], ("error", CONNECT)),
    Case("reset_mid_body", [head("200 OK", "content-length: 100") + BODY, Wait(0.05), Reset()], ("error", CONNECT)),
    Case(
        "close_mid_chunk",
        [head("200 OK", "transfer-encoding: chunked") + b"20\r\n" + BODY, Close()],
        ("error", CONNECT),
    ),
    Case(
        "close_before_last_chunk",
        [head("200 OK", "transfer-encoding: chunked") + b"8\r\n" + BODY + CRLF, Close()],
        ("error", CONNECT),
    ),
    Case("extra_bytes_after_body", [ok() + SMUGGLED], ("ok", 200, BODY), "the smuggled answer must reach nobody"),
    Case(
        "extra_bytes_after_chunked",
        [head("200 OK", "transfer-encoding: chunked") + chunked(BODY) + SMUGGLED],
        ("ok", 200, BODY),
    ),
    Case(
        "extra_bytes_later",
        [ok(), Wait(0.05), SMUGGLED],
        ("ok", 200, BODY),
        "arrives while the connection idles",
        pause=0.2,
    ),
    Case("interim_then_close", [head("100 Continue"), Close()], ("error", CONNECT)),
    # -- time ----------------------------------------------------------------------------------------------
    Case("trickle_within_timeouts", trickle(ok(), 0.01), ("ok", 200, BODY)),
    Case(
        "head_in_pieces_past_first_byte",
        [
            b"HTTP/1.1 200 OK\r\n",
            Wait(0.6),
            b"content-type: application/json\r\n",
            Wait(0.6),
            b"content-length: 8\r\n\r\n" + BODY,
        ],
        ("ok", 200, BODY),
        "first_byte_ms bounds each wait for the head, not the whole head: no piece is late",
    ),
    Case("trickle_past_total", [head("200 OK", "content-length: 200"), *trickle(b"x" * 200, 0.05)], ("error", TIMEOUT)),
    Case("silent", [Wait(30)], ("error", TIMEOUT)),
    Case("headers_then_silent", [head("200 OK", "content-length: 100"), Wait(30)], ("error", TIMEOUT)),
    Case(
        "keepalive_close_after_answer",
        [ok(), Wait(0.02), Close()],
        ("ok", 200, BODY),
        "reuse must skip the dead connection",
        pause=0.2,
    ),
    Case("keepalive_reset_after_answer", [ok(), Wait(0.02), Reset()], ("ok", 200, BODY), pause=0.2),
    Case("keepalive_close_racing_reuse", [ok(), Wait(0.02), Close()], ("ok", 200, BODY), race=True),
]

BY_NAME = {c.name: c for c in CASES}


class HostileServer:
    """The raw loopback server; `connections` counts accepted connections."""

    def __init__(self) -> None:
        self.connections = 0
        self.served: list[str] = []
        self.scripts_ended = 0  # scripts run to their end, or cut short by the client leaving
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.connections += 1
        try:
            await self._serve(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        except asyncio.CancelledError:
            # stop() cancels what is still waiting; ending quietly keeps asyncio's stream callback from
            # logging the cancellation as an error.
            pass
        finally:
            self._tasks.discard(task)
            writer.transport.abort()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            raw = await reader.readuntil(b"\r\n\r\n")
            headers: dict[str, str] = {}
            for line in raw.decode("latin-1").split("\r\n")[1:]:
                name, sep, value = line.partition(":")
                if sep:
                    headers[name.strip().lower()] = value.strip()
            await reader.readexactly(int(headers.get("content-length", "0")))
            case = headers.get("x-case")
            if case is None:
                body = b'{"n":' + headers.get("x-req", "0").encode() + b"}"
                writer.write(head("200 OK", f"content-length: {len(body)}") + body)
                await writer.drain()
                self.served.append(headers.get("x-req", "?"))
                continue
            self.served.append(case)
            try:
                for step in BY_NAME[case].script:
                    if isinstance(step, bytes):
                        writer.write(step)
                        await writer.drain()
                    elif isinstance(step, Wait):
                        await asyncio.sleep(step.seconds)
                    elif isinstance(step, Close):
                        writer.close()
                        return
                    else:
                        sock = writer.get_extra_info("socket")
                        if sock is not None:
                            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                        writer.transport.abort()
                        return
            finally:
                self.scripts_ended += 1
