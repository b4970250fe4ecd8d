"""Hostile upstream streams through the gateway served by uvicorn, over real sockets, on both transports.

- A gzip stream decoding to a flood of blank lines: parsed 64 KiB a turn while `/health` answers (before,
  in one turn of the event loop: every other request of the worker waited seconds).
- An endless stream read by a client slower than the upstream: `total_ms` still ends it (before, h1 looked
  at the deadline only when it waited for the socket, which it never did while the client was slower).
- A client that reads nothing of a fanned-out stream: its upstreams are held back (before, the merge read
  them as fast as they sent and held it all, parsed).
- A leading byte order mark and CR-only line ends, as the SSE standard allows: every event reaches the
  client (before, the first event was lost, or the whole stream).
- A finish sent twice for one choice of `n: 2` finishes no other choice (before, the stream ended whole).
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
import zlib
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Final

import httpx
import pytest
from aiohttp import web

from tests.helpers.clients import sse_data
from tests.helpers.faults import CHUNKS, DONE_EVENT, RECORDED_STREAM_TEXT
from tests.helpers.servers import GatewayThread, serve_config
from tests.helpers.upstreams import Received, Upstream, reply_stream
from tests.security.conftest import HealthProbe

MiB: Final = 1024 * 1024
STEP: Final = 64 * 1024  # what the gateway hands on of an upstream's body before it looks at its deadline again
TRANSPORT_HIGH_WATER: Final = 64 * 1024  # the most an event loop's transport holds before its writer waits
MODEL: Final = "up/davinci-002"
BOM: Final = b"\xef\xbb\xbf"

# The idle time is left to `total_ms`: a flood parsed on a loaded machine may take longer than `first_byte_ms`.
CONFIG: Final = """
server: {{host: 127.0.0.1, port: 0}}
timeouts: {{connect_ms: 2000, first_byte_ms: {first_byte}, total_ms: {total}, stream_idle_ms: {total}}}
retries: {{attempts: 1}}
caps: {{upstream_idle_stream_bytes: {idle}}}
providers:
  up: {{kind: openai, api_key: sk-stream-hostile, base_url: '{url}/v1', transport: {transport}{more}}}
"""


def gateway(
    tmp_path: Path,
    upstream: Upstream,
    transport: str = "h1",
    total: int = 30000,
    first_byte: int = 10000,
    max_n: int = 0,
    idle: int = MiB,
) -> AbstractContextManager[GatewayThread]:
    more = f", max_n: {max_n}" if max_n else ""
    config = CONFIG.format(
        url=upstream.url, transport=transport, total=total, first_byte=first_byte, more=more, idle=idle
    )
    return serve_config(tmp_path, config)


def post(gw: GatewayThread, **extra: Any) -> httpx.Response:
    body = {"model": MODEL, "prompt": "Say this is a test", "max_tokens": 16, "stream": True, **extra}
    with httpx.Client(trust_env=False, timeout=60) as client:
        return client.post(gw.url + "/v1/completions", json=body)


def streamed(resp: httpx.Response) -> tuple[str, list[Any]]:
    """The text of a stream's choices, and its events (all but `[DONE]`), parsed."""
    assert resp.status_code == 200, resp.text[:500]
    events = sse_data(resp.text)
    assert events[-1] == "[DONE]", events[-3:]
    parsed = [json.loads(e) for e in events[:-1]]
    text = "".join(ch["text"] for c in parsed for ch in c.get("choices", ()))
    return text, parsed


# -- a compressed flood of blank lines ----------------------------------------------------------------


def _gzipped_flood(lines: int) -> bytes:
    """The recorded stream with `lines` blank lines after its first event, gzip-encoded (about 1/1000 the size)."""
    z = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    parts = [z.compress(CHUNKS[0] + b"\n\n")]
    block = b"\n" * MiB
    parts += [z.compress(block) for _ in range(lines // MiB)]
    parts += [z.compress(b"".join(e + b"\n\n" for e in [*CHUNKS[1:], DONE_EVENT])), z.flush()]
    return b"".join(parts)


# 8 MiB: parsed in one turn (before), it held the loop for 4 to 5 s on a loaded 2-core machine, ten times the
# bound below; every MiB more only repeats the same steps.
FLOOD: Final = _gzipped_flood(8 * MiB)


async def _flood(request: web.Request, received: Received) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"content-type": "text/event-stream", "content-encoding": "gzip"})
    await resp.prepare(request)
    await resp.write(FLOOD)  # one write: the gateway has it all after one or two socket reads
    await resp.write_eof()
    return resp


@pytest.mark.parametrize("transport", ["h1", "httpx"])
def test_a_compressed_flood_of_blank_lines_never_holds_the_event_loop(
    tmp_path: Path, upstream: Upstream, transport: str
) -> None:
    assert len(FLOOD) < 64 * 1024
    upstream.handler = _flood
    # The idle cap raised past the flood: what is measured here is the event loop while it is parsed.
    with gateway(tmp_path, upstream, transport, idle=32 * MiB) as gw, HealthProbe(gw.url) as probe:
        resp = post(gw)
    text, _ = streamed(resp)
    assert text == RECORDED_STREAM_TEXT
    # One 64 KiB step of blank lines is tens of milliseconds; the whole flood held the loop for seconds.
    assert probe.answers > 0 and probe.slowest < 0.5, (probe.answers, probe.slowest)


# -- total_ms with a client slower than the upstream --------------------------------------------------


class Endless:
    """An upstream that streams the recorded events without end, as fast as it can, until the gateway hangs up."""

    def __init__(self) -> None:
        self.began = self.ended = 0.0
        self.sent = 0  # bytes written, over every call it answers

    async def __call__(self, request: web.Request, received: Received) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        burst = b"".join(e + b"\n\n" for e in CHUNKS[:15])  # never the last, which carries the finish
        self.began = time.monotonic()
        try:
            while time.monotonic() - self.began < 60:
                await resp.write(burst)
                self.sent += len(burst)
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self.ended = time.monotonic()
        return resp


def _stream_request(gw: GatewayThread, **extra: Any) -> socket.socket:
    """A stream asked for on a socket with a small receive buffer, whose answer the caller reads (or not)."""
    body = {"model": MODEL, "prompt": "Say this is a test", "max_tokens": 16, "stream": True, **extra}
    raw = json.dumps(body).encode()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", gw.port))
    sock.settimeout(10)
    sock.sendall(
        b"POST /v1/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%s" % (len(raw), raw)
    )
    return sock


def _slow_client(gw: GatewayThread, until: float, upstream: Endless) -> tuple[bytes, list[tuple[float, int]]]:
    """A stream read at most 4 KiB every 10 ms (the upstream writes megabytes a second) while the upstream streams,
    then at once to its end; or until `until`. Also when each read returned, with the bytes read by then."""
    sock = _stream_request(gw)
    got = bytearray()
    reads: list[tuple[float, int]] = []
    try:
        while time.monotonic() < until:
            data = sock.recv(4096)
            reads.append((time.monotonic(), len(got) + len(data)))
            if not data:
                break
            got += data
            if got.endswith(b"0\r\n\r\n"):  # the chunked answer's end
                break
            if not upstream.ended:
                time.sleep(0.01)
    finally:
        sock.close()
    return bytes(got), reads


@pytest.mark.parametrize("transport", ["h1", "httpx"])
def test_a_stream_read_slower_than_it_arrives_still_ends_at_total_ms(
    tmp_path: Path, upstream: Upstream, transport: str
) -> None:
    endless = Endless()
    upstream.handler = endless
    with gateway(tmp_path, upstream, transport, total=3000, first_byte=2000) as gw:
        # What is on its way to the client when the deadline comes is read at the client's pace before the gateway
        # can send its error; left to the kernel, the send buffer grows to hundreds of kilobytes, seconds of it.
        on_the_way = gw.pin_send_buffer(64 * 1024) + TRANSPORT_HIGH_WATER
        got, reads = _slow_client(gw, time.monotonic() + 12, endless)
    assert got.startswith(b"HTTP/1.1 200 ")
    assert endless.ended, "the gateway was still reading the upstream 12 s into a 3 s total_ms"
    # The gateway's deadline began before the upstream answered: by then it had passed.
    deadline = endless.began + 3
    read_by = [n for t, n in reads if t < deadline], [n for t, n in reads if t < endless.ended]
    after = max(read_by[1], default=0) - max(read_by[0], default=0)
    # Once the deadline passed, the client took what was on its way and at most one 64 KiB step of the upstream's
    # (its events written anew, with room) before the gateway hung up: counted in bytes, not at a loaded
    # machine's pace.
    assert after < on_the_way + 2 * STEP, (after, on_the_way, endless.ended - endless.began)
    # The client learns why its stream ended, and the stream ends.
    assert b'"code":"upstream_total_timeout"' in got and b"data: [DONE]" in got, got[-600:]


@pytest.mark.parametrize("n", [1, 2])
def test_a_client_that_reads_nothing_holds_its_upstreams_back(tmp_path: Path, upstream: Upstream, n: int) -> None:
    """With `max_n: 1`, `n: 2` is two upstream calls whose streams the gateway merges (docs/emulation.md)."""
    endless = Endless()
    upstream.handler = endless
    with gateway(tmp_path, upstream, max_n=1) as gw:
        sock = _stream_request(gw, n=n)
        try:
            assert sock.recv(12) == b"HTTP/1.1 200"
            time.sleep(2)  # every buffer on the way fills: the client's, the gateway's, the upstream's sockets
            filled = endless.sent
            time.sleep(2)
            more = endless.sent - filled
        finally:
            sock.close()
    assert len(upstream.received) == n
    # Before, a merged stream's upstreams were read (and their events parsed and held) as fast as they sent:
    # tens of megabytes a second here, for as long as the client stayed.
    assert more < 1 * MiB, (filled, more)


# -- line ends and a byte order mark the SSE standard allows ----------------------------------------


def test_a_stream_beginning_with_a_byte_order_mark_keeps_its_first_event(tmp_path: Path, upstream: Upstream) -> None:
    events = [e + b"\n\n" for e in [*CHUNKS, DONE_EVENT]]
    upstream.handler = reply_stream([BOM + events[0], *events[1:]], "text/event-stream")
    with gateway(tmp_path, upstream) as gw:
        text, _ = streamed(post(gw))
    assert text == RECORDED_STREAM_TEXT


@pytest.mark.parametrize("ends", [b"\r", b"\r\n"], ids=["cr", "crlf"])
def test_a_stream_whose_lines_end_with_a_cr_is_read_whole(tmp_path: Path, upstream: Upstream, ends: bytes) -> None:
    raw = b"".join(e + ends + ends for e in [*CHUNKS, DONE_EVENT])
    # Written in pieces of 7 bytes: line ends split from their lines, and a CRLF between two writes.
    upstream.handler = reply_stream([raw[i : i + 7] for i in range(0, len(raw), 7)], "text/event-stream", hold_s=30)
    with gateway(tmp_path, upstream) as gw:
        started = time.monotonic()
        text, _ = streamed(post(gw))
    assert text == RECORDED_STREAM_TEXT
    assert time.monotonic() - started < 5  # at its [DONE], not when the held-open body would end


# -- a finish sent twice -----------------------------------------------------------------------------


def _chunk(index: int, text: str, finish: str | None) -> bytes:
    event: dict[str, Any] = json.loads(CHUNKS[0][len(b"data: ") :])
    event["choices"] = [{"text": text, "index": index, "logprobs": None, "finish_reason": finish}]
    return b"data: " + json.dumps(event).encode()


def test_a_finish_sent_twice_for_one_choice_does_not_finish_another(tmp_path: Path, upstream: Upstream) -> None:
    events = [_chunk(0, "Hello", None), _chunk(0, "", "stop"), _chunk(0, "", "stop"), DONE_EVENT]
    upstream.handler = reply_stream([e + b"\n\n" for e in events], "text/event-stream")
    with gateway(tmp_path, upstream) as gw:
        text, parsed = streamed(post(gw, n=2))
    assert text == "Hello"
    error = parsed[-1].get("error")
    assert error is not None and error["code"] == "upstream_ignored_n", parsed[-1]
