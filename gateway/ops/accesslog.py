"""One structured JSON line per request, written to stderr.

Lines are encoded with msgspec straight onto one buffer and written in batches (a write per request is a
system call per request) that stay under PIPE_BUF, so workers sharing stderr never interleave. Fields:
docs/observability.md.
"""

from __future__ import annotations

import asyncio
import math
import os
import sys
import time
from collections.abc import Callable
from typing import Final

import msgspec
from msgspec import UNSET, UnsetType

from gateway.ops.metrics import Record

_encode_into = msgspec.json.Encoder().encode_into
_floor = math.floor
_FLUSH_BYTES: Final = 4096
_FLUSH_S: Final = 0.2


class Sink:
    def __init__(self, fd: int | None = None) -> None:
        self.fd = fd
        self.buf = bytearray()
        self._timer: asyncio.TimerHandle | None = None
        # Extra receivers of every line (tests read them here instead of parsing stderr).
        self.listeners: list[Callable[[bytes], None]] = []

    def added(self, start: int) -> None:
        """What a line that ends the buffer from `start` needs besides: its listeners, the write of the lines
        before it when it takes the buffer past 4 KiB, and the timer that writes it out."""
        buf = self.buf
        if self.listeners:
            line = bytes(buf[start:-1])
            for listener in self.listeners:
                listener(line)
        if len(buf) > _FLUSH_BYTES and start:
            # The lines before it go in one write of at most 4 KiB; the timer, still armed, writes this one.
            before = buf[:start]
            del buf[:start]
            self._out(before)
        if self._timer is None:
            try:
                self._timer = asyncio.get_running_loop().call_later(_FLUSH_S, self.flush)
            except RuntimeError:
                self.flush()  # no loop (a script or a test): write at once

    def flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self.buf:
            return
        data, self.buf = self.buf, bytearray()
        self._out(data)

    def _out(self, data: bytes | bytearray) -> None:
        fd = sys.stderr.fileno() if self.fd is None else self.fd
        try:
            while data:
                data = data[os.write(fd, data) :]
        except OSError:
            pass  # a closed or full stderr must never take a request down


SINK = Sink()


class _Line(msgspec.Struct, gc=False):  # holds no container, so no cycle
    """One line's fields in their order (docs/observability.md). A struct, not a dict: msgspec fills it from
    positional values without a Python call, and encodes it in that order; an `UNSET` field is left out."""

    ts: float
    request_id: str
    dialect: str
    endpoint: str
    key: str | None
    model: str
    provider: str | None
    target: str | None
    status: int
    latency_ms: float
    upstream_ms: float
    attempts: int
    prompt_tokens: int | None
    completion_tokens: int | None
    stream: bool
    error: str | None
    cause: str | None
    usage_estimated: bool | UnsetType = UNSET
    queue_ms: float | UnsetType = UNSET
    batch_id: str | UnsetType = UNSET
    prompt: str | UnsetType = UNSET
    completion: str | None | UnsetType = UNSET


def write(rec: Record, elapsed_s: float) -> None:
    """`rec`'s line onto the sink's buffer: encoded there, with no bytes object of its own and no copy."""
    # Milliseconds to 3 decimals as `round(x, 3)` gives them (ties aside) without its decimal string round trip,
    # which cost three times more than building the rest of the line; `math.floor` costs less than `// 1`
    # (a float's floor division computes its remainder too) and `int()`.
    usage = rec.usage
    entry = _Line(
        _floor(time.time() * 1000.0 + 0.5) / 1000.0,
        rec.request_id,
        rec.dialect,
        rec.endpoint,
        rec.key_label,  # the key's label, read off the key when the request was authorized: no call here
        rec.model,
        rec.provider or None,
        rec.target or None,
        rec.status,
        _floor(elapsed_s * 1e6 + 0.5) / 1000.0,
        _floor(rec.upstream_s * 1e6 + 0.5) / 1000.0,
        rec.attempts,
        usage.prompt_tokens if usage else None,
        usage.completion_tokens if usage else None,
        rec.stream,
        rec.error_code,
        rec.cause,
    )
    if rec.usage_estimated:
        entry.usage_estimated = True
    waited = rec.queue_s
    if waited is not None:  # a request that passed a server with max_concurrency: its time waiting there
        entry.queue_ms = _floor(waited * 1e6 + 0.5) / 1000.0 if waited else 0.0  # most found a slot free
    if rec.batch_id is not None:
        entry.batch_id = rec.batch_id
    if rec.prompt is not None:
        entry.prompt = rec.prompt
        entry.completion = rec.completion
    # The sink's part here, not in a method of its own: one call per line.
    sink = SINK
    buf = sink.buf
    start = len(buf)
    try:
        _encode_into(entry, buf, start)
    except BaseException:
        del buf[start:]  # what a failed encoding left: the lines before stay whole
        raise
    buf += b"\n"
    if len(buf) > _FLUSH_BYTES or sink._timer is None or sink.listeners:
        sink.added(start)
