"""Fast Python loopback upstream for streaming and slow-upstream scenarios (nginx cannot stream SSE or wait).

A raw asyncio protocol on uvloop with httptools, so its own cost stays well below the gateway's.
Run: ``python -m bench.upstream.server --port 9000 --chunks 100 --latency-ms 50``; what it answers:
docs/bench-harness.md.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from typing import cast

import httptools
import uvloop

from bench.upstream import CHAT_BODY, COMPLETION_BODY, chat_stream_events, stream_events

_JSON_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n" % len(COMPLETION_BODY)
_CHAT_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n" % len(CHAT_BODY)
_SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n"
)
_HEALTH = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n"
_BAD_REQUEST = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
_LAST_CHUNK = b"0\r\n\r\n"
_CLOSE = b"Connection: close\r\n\r\n"
_KEEP = b"\r\n"
# Matching bytes instead of decoding JSON keeps the upstream's per-request cost negligible.
_STREAM_MARKERS = (b'"stream":true', b'"stream": true')
_CHAT_PATH = b"/chat/completions"


class Settings:
    """Behaviour knobs, fixed for the life of the server."""

    def __init__(
        self, latency_ms: float, chunks: int, chunk_interval_ms: float, slow_every: int = 0, slow_ms: float = 0.0
    ) -> None:
        self.latency_s = latency_ms / 1000.0
        # A deterministic tail (every Nth answer takes slow_ms): what hedging is for, reproducibly.
        self.slow_every = slow_every
        self.slow_s = slow_ms / 1000.0
        self.served = 0
        self.chunk_interval_s = chunk_interval_ms / 1000.0
        # Chunked transfer-encoding frames are precomputed once; serving is then pure writes.
        self.frames = [b"%x\r\n%s\r\n" % (len(ev), ev) for ev in stream_events(chunks)]
        self.burst = b"".join(self.frames) + _LAST_CHUNK
        self.chat_frames = [b"%x\r\n%s\r\n" % (len(ev), ev) for ev in chat_stream_events(chunks)]
        self.chat_burst = b"".join(self.chat_frames) + _LAST_CHUNK


class UpstreamProtocol(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection; requests are answered strictly in order."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpRequestParser(self)
        self._body = bytearray()
        self._url = b""
        self._tasks: set[asyncio.Task[None]] = set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's TCPTransport implements asyncio.Transport without subclassing it.
        self._transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        for task in self._tasks:
            task.cancel()
        self._transport = None

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError:
            if self._transport is not None:
                self._transport.write(_BAD_REQUEST)
                self._transport.close()

    # httptools parser callbacks.
    def on_url(self, url: bytes) -> None:
        self._url = url

    def on_body(self, body: bytes) -> None:
        self._body += body

    def on_message_complete(self) -> None:
        keep_alive = bool(self._parser.should_keep_alive())
        method = bytes(self._parser.get_method())
        wants_stream = any(marker in self._body for marker in _STREAM_MARKERS)
        chat = self._url.split(b"?", 1)[0].endswith(_CHAT_PATH)
        self._body.clear()
        tail = _KEEP if keep_alive else _CLOSE
        answer = _CHAT_HEAD + tail + CHAT_BODY if chat else _JSON_HEAD + tail + COMPLETION_BODY
        if method != b"POST":
            self._send(_HEALTH + tail + b"ok", keep_alive)
        elif wants_stream:
            task = asyncio.get_running_loop().create_task(self._stream(tail, keep_alive, chat))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        elif self._settings.latency_s > 0 or self._settings.slow_every:
            settings = self._settings
            settings.served += 1
            slow = settings.slow_every and settings.served % settings.slow_every == 0
            asyncio.get_running_loop().call_later(
                settings.slow_s if slow else settings.latency_s,
                self._send,
                answer,
                keep_alive,
            )
        else:
            self._send(answer, keep_alive)

    def _send(self, payload: bytes, keep_alive: bool) -> None:
        if self._transport is None or self._transport.is_closing():
            return
        self._transport.write(payload)
        if not keep_alive:
            self._transport.close()

    async def _stream(self, tail: bytes, keep_alive: bool, chat: bool) -> None:
        settings = self._settings
        if settings.latency_s > 0:
            await asyncio.sleep(settings.latency_s)
        if self._transport is None:
            return
        if settings.chunk_interval_s <= 0:
            # One write: the cost under test is the gateway's per-event work, not ours.
            self._send(_SSE_HEAD + tail + (settings.chat_burst if chat else settings.burst), keep_alive)
            return
        self._transport.write(_SSE_HEAD + tail)
        for index, frame in enumerate(settings.chat_frames if chat else settings.frames):
            if index:
                await asyncio.sleep(settings.chunk_interval_s)
            if self._transport is None or self._transport.is_closing():
                return
            self._transport.write(frame)
        self._send(_LAST_CHUNK, keep_alive)


async def serve(host: str, port: int, settings: Settings) -> None:
    """Serve until SIGTERM or SIGINT."""
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: UpstreamProtocol(settings), host, port, backlog=4096)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--latency-ms", type=float, default=0.0, help="wait before answering")
    parser.add_argument("--chunks", type=int, default=100, help="SSE events per streamed answer")
    parser.add_argument("--chunk-interval-ms", type=float, default=0.0, help="gap between SSE events")
    parser.add_argument("--slow-every", type=int, default=0, help="every Nth non-streamed answer is slow")
    parser.add_argument("--slow-ms", type=float, default=0.0, help="how long a slow answer waits")
    args = parser.parse_args(argv)
    settings = Settings(args.latency_ms, args.chunks, args.chunk_interval_ms, args.slow_every, args.slow_ms)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(serve(args.host, args.port, settings))


if __name__ == "__main__":
    main()
