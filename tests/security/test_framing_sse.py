"""gateway/upstream/framing.py: stream decoders are linear in their input and hold at most one capped event.

Before the fix an unterminated SSE line was re-concatenated on every feed (quadratic in its length) and
never bounded. The unit tests feed the decoders byte sequences directly; the end-to-end test streams an
endless line from a real aiohttp upstream through the gateway served by uvicorn.
"""

from __future__ import annotations

import asyncio
import json
import struct
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import httpx
import pytest
from aiohttp import web

from gateway.config import CapsConfig
from gateway.upstream.framing import (
    BOM,
    DECODERS,
    MAX_EVENT_BYTES,
    EventStreamDecoder,
    EventTooLarge,
    NDJSONDecoder,
    SSEDecoder,
)
from tests.helpers.servers import GatewayThread
from tests.helpers.upstreams import Received, Upstream

KiB: Final = 1024
MiB: Final = 1024 * KiB


def feed_until_refused(decoder: SSEDecoder | NDJSONDecoder, chunk: bytes, total: int, budget_s: float) -> int:
    """Feed `total` bytes in `chunk`s; the bytes fed when the decoder refused (fails past the time budget)."""
    started = time.monotonic()
    fed = 0
    with pytest.raises(EventTooLarge, match=r"cap of \d+ bytes \(caps.upstream_event_bytes\)"):
        while fed < total:
            decoder.feed(chunk)
            fed += len(chunk)
            if fed % (256 * KiB) == 0:
                assert time.monotonic() - started < budget_s, f"{fed} bytes took {time.monotonic() - started:.1f} s"
    return fed


def test_the_default_cap_is_the_configs() -> None:
    assert MAX_EVENT_BYTES == CapsConfig().upstream_event_bytes == MiB


@pytest.mark.parametrize("decoder", [SSEDecoder, NDJSONDecoder])
def test_an_unterminated_line_in_small_chunks_is_refused_at_the_cap_quickly(decoder: type[SSEDecoder]) -> None:
    d = decoder()
    d.feed(b'data: {"choices": [{"text": "' if decoder is SSEDecoder else b'{"response": "')
    fed = feed_until_refused(d, b"a" * KiB, 8 * MiB, budget_s=2.0)
    assert MiB - 2 * KiB <= fed <= MiB + KiB


@pytest.mark.parametrize("decoder", [SSEDecoder, NDJSONDecoder])
def test_decoding_is_linear_in_the_line_length(decoder: type[SSEDecoder]) -> None:
    """8 MiB of one line in 1 KiB chunks under a cap above it: each byte is copied a bounded number of times."""
    d = decoder(max_event_bytes=64 * MiB)
    head = b"data: " if decoder is SSEDecoder else b""
    started = time.monotonic()
    d.feed(head)
    chunk = b"b" * KiB
    for _ in range(8 * KiB):
        assert d.feed(chunk) == []
    events = d.feed(b"\n\n")
    took = time.monotonic() - started
    assert events == [(None, b"b" * (8 * MiB))]
    assert took < 1.0, took  # quadratic before: 8192 feeds each re-copying the pending line


def test_many_data_lines_joined_into_one_event_are_capped_too() -> None:
    d = SSEDecoder(max_event_bytes=64 * KiB)
    with pytest.raises(EventTooLarge):
        for _ in range(100):
            d.feed(b"data: " + b"c" * KiB + b"\n")


def test_a_long_line_inside_one_chunk_is_capped() -> None:
    with pytest.raises(EventTooLarge):
        NDJSONDecoder(max_event_bytes=4 * KiB).feed(b"d" * (8 * KiB) + b"\n")
    with pytest.raises(EventTooLarge):
        SSEDecoder(max_event_bytes=4 * KiB).feed(b"data: " + b"d" * (8 * KiB) + b"\n\n")


def test_lines_at_the_cap_pass_whole_whatever_the_split() -> None:
    payload = b"e" * (4 * KiB - len(b"data: "))
    raw = b"data: " + payload + b"\r\n\r\ndata: [DONE]\n\n"
    for size in (1, 3, 1000, len(raw)):
        d = SSEDecoder(max_event_bytes=4 * KiB)
        got = [e for i in range(0, len(raw), size) for e in d.feed(raw[i : i + size])] + d.close()
        assert got == [(None, payload), (None, b"[DONE]")], size


@pytest.mark.parametrize("end", [b"\n", b"\r\n", b"\r"], ids=["lf", "crlf", "cr"])
def test_every_line_end_and_a_leading_bom_give_the_same_events_whatever_the_split(end: bytes) -> None:
    """The SSE standard's three line ends, and the byte order mark a stream may begin with (skipped once)."""
    lines = [b"data: a", b"data: b", b"", b": keep-alive", b"", b"data:[DONE]", b""]
    raw = BOM + b"".join(line + end for line in lines)
    for size in (1, 2, 3, 5, 8, len(raw)):
        d = SSEDecoder()
        got = [e for i in range(0, len(raw), size) for e in d.feed(raw[i : i + size])] + d.close()
        assert got == [(None, b"a\nb"), (None, b"[DONE]")], size
    # A BOM past the stream's first bytes is not skipped: its line names no field.
    d = SSEDecoder()
    assert d.feed(b"data: a\n\n" + BOM + b"data: b\n\n") + d.close() == [(None, b"a")]


def _frame(payload: bytes) -> bytes:
    """One AWS event-stream frame without headers: prelude, its CRC, payload, message CRC."""
    prelude = struct.pack(">II", 16 + len(payload), 0)
    head = prelude + struct.pack(">I", zlib.crc32(prelude)) + payload
    return head + struct.pack(">I", zlib.crc32(head))


def test_the_event_stream_decoder_is_linear_and_capped() -> None:
    frame = _frame(b"f" * (MiB - 64))
    d = EventStreamDecoder()
    started = time.monotonic()
    events = [e for i in range(0, len(frame), KiB) for e in d.feed(frame[i : i + KiB])]
    assert time.monotonic() - started < 1.0
    assert events == [(None, b"f" * (MiB - 64))] and d.close() == []
    # A frame whose declared payload is over the cap is refused from its prelude, before it is waited for.
    with pytest.raises(EventTooLarge):
        EventStreamDecoder(max_event_bytes=64 * KiB).feed(_frame(b"g" * (128 * KiB))[:12])


def test_every_decoder_takes_the_cap() -> None:
    for kind, decoder in DECODERS.items():
        assert decoder(max_event_bytes=2 * KiB) is not None, kind


# -- end to end ----------------------------------------------------------------------------------

CONFIG: Final = """
server: {{host: 127.0.0.1, port: 0}}
timeouts: {{connect_ms: 2000, first_byte_ms: 10000, total_ms: 30000}}
retries: {{attempts: 1}}
providers:
  up: {{kind: openai, api_key: sk-sse-e2e, base_url: {u}/v1}}
"""


@pytest.fixture
def endless() -> Iterator[tuple[Upstream, dict[str, int]]]:
    """An upstream whose one SSE line never ends: 1 KiB writes until the gateway hangs up (or 64 MiB)."""
    server = Upstream()
    sent = {"bytes": 0}

    async def stream(request: web.Request, received: Received) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b'data: {"choices": [{"text": "')
        try:
            while sent["bytes"] < 64 * MiB:
                await resp.write(b"a" * KiB)
                sent["bytes"] += KiB
                await asyncio.sleep(0)
        except (ConnectionError, asyncio.CancelledError):
            pass
        return resp

    server.handler = stream
    with server:
        yield server, sent


def test_an_endless_stream_line_is_refused_end_to_end(endless: tuple[Upstream, dict[str, int]], tmp_path: Path) -> None:
    server, sent = endless
    path = tmp_path / "config.yaml"
    path.write_text(CONFIG.format(u=server.url))
    gw = GatewayThread(path, {})
    gw.start()
    try:
        started = time.monotonic()
        with httpx.Client(base_url=gw.url, trust_env=False, timeout=60) as http:
            resp = http.post(
                "/v1/completions", json={"model": "up/davinci-002", "prompt": "hi", "stream": True, "max_tokens": 4}
            )
        took = time.monotonic() - started
    finally:
        gw.stop()
    assert resp.status_code == 502, resp.text
    assert "caps.upstream_event_bytes" in json.loads(resp.text)["error"]["message"]
    assert took < 10, took
    assert sent["bytes"] < 32 * MiB  # the gateway let go near the cap, not at the end of the deadline


def test_the_configured_event_cap_is_the_one_applied(endless: tuple[Upstream, dict[str, int]], tmp_path: Path) -> None:
    server, sent = endless
    path = tmp_path / "config.yaml"
    path.write_text(CONFIG.format(u=server.url) + "caps: {upstream_event_bytes: 65536}\n")
    gw = GatewayThread(path, {})
    gw.start()
    try:
        with httpx.Client(base_url=gw.url, trust_env=False, timeout=60) as http:
            resp = http.post(
                "/v1/completions", json={"model": "up/davinci-002", "prompt": "hi", "stream": True, "max_tokens": 4}
            )
    finally:
        gw.stop()
    assert resp.status_code == 502, resp.text
    message = json.loads(resp.text)["error"]["message"]
    assert "caps.upstream_event_bytes" in message and "65536" in message.replace(",", ""), message
    assert sent["bytes"] < 4 * MiB  # refused near 64 KiB, far below the default 1 MiB cap's point
