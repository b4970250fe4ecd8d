"""Stream framing, parsed once for every provider: server-sent events, NDJSON and AWS event streams.

The decoders are incremental: they take whatever byte chunks the socket yields and return complete
events, so a stream is relayed as it arrives. Tolerated on purpose: `data:` with or without the space
(TGI omits it), CRLF line ends (Gemini), comment lines and blank keep-alives (DeepSeek under load).
The binary AWS event stream (Bedrock's `application/vnd.amazon.eventstream`) is not tolerant: a frame
whose checksum does not match is a broken stream, never guessed at.
"""

from __future__ import annotations

import struct
import zlib
from typing import Final, Protocol

from gateway.errors import UpstreamError

DONE: Final = b"data: [DONE]\n\n"


class SSEDecoder:
    __slots__ = ("_buf", "_data", "_event")

    def __init__(self) -> None:
        self._buf = b""
        self._data: list[bytes] = []
        self._event: str | None = None

    def feed(self, chunk: bytes) -> list[tuple[str | None, bytes]]:
        """Return the (event name, data) pairs completed by this chunk."""
        buf = self._buf + chunk if self._buf else chunk
        events: list[tuple[str | None, bytes]] = []
        start = 0
        while True:
            nl = buf.find(b"\n", start)
            if nl < 0:
                break
            line = buf[start:nl]
            start = nl + 1
            if line.endswith(b"\r"):
                line = line[:-1]
            self._line(line, events)
        self._buf = buf[start:]
        return events

    def close(self) -> list[tuple[str | None, bytes]]:
        """Flush an event the upstream ended without a blank line (common before a close)."""
        events: list[tuple[str | None, bytes]] = []
        if self._buf:
            line, self._buf = self._buf.rstrip(b"\r"), b""
            self._line(line, events)
        self._line(b"", events)
        return events

    def _line(self, line: bytes, events: list[tuple[str | None, bytes]]) -> None:
        if not line:
            if self._data:
                events.append((self._event, b"\n".join(self._data)))
            self._data = []
            self._event = None
            return
        if line[:1] == b":":
            return
        field, _, value = line.partition(b":")
        if value[:1] == b" ":
            value = value[1:]
        if field == b"data":
            self._data.append(value)
        elif field == b"event":
            self._event = value.decode("utf-8", "replace")


class NDJSONDecoder:
    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, chunk: bytes) -> list[tuple[str | None, bytes]]:
        buf = self._buf + chunk if self._buf else chunk
        lines = buf.split(b"\n")
        self._buf = lines.pop()
        return [(None, line) for line in lines if line.strip()]

    def close(self) -> list[tuple[str | None, bytes]]:
        rest, self._buf = self._buf, b""
        return [(None, rest)] if rest.strip() else []


class EventStreamError(UpstreamError):
    """A malformed AWS event-stream frame: the bytes are not what the upstream sent, or not a stream."""

    # Like a connection dropped mid-answer: the next attempt gets a fresh stream.
    retryable = True


# Prelude: total length, headers length (both big-endian uint32), then the CRC32 of those 8 bytes.
_PRELUDE: Final = struct.Struct(">III")
_CRC: Final = struct.Struct(">I")
# The smallest frame is a prelude and a message CRC; the caps are the AWS SDKs' (botocore eventstream.py).
_MIN_FRAME: Final = 16
_MAX_HEADERS: Final = 128 * 1024
_MAX_PAYLOAD: Final = 16 * 1024 * 1024
# Header value types: the fixed-size ones by byte width; 6 (bytes) and 7 (string) carry a uint16 length.
_FIXED: Final[dict[int, int]] = {0: 0, 1: 0, 2: 1, 3: 2, 4: 4, 5: 8, 8: 8, 9: 16}


def _frame_headers(raw: bytes) -> dict[str, str]:
    """The string headers of one frame (`:event-type`, `:message-type`...); other types are skipped."""
    out: dict[str, str] = {}
    i, end = 0, len(raw)
    while i < end:
        size = raw[i]
        name = raw[i + 1 : i + 1 + size].decode("utf-8", "replace")
        i += 1 + size
        if i >= end:
            raise EventStreamError("Upstream sent a malformed event-stream frame: truncated header")
        kind = raw[i]
        i += 1
        if kind in (6, 7):
            (length,) = struct.unpack_from(">H", raw, i)
            value = raw[i + 2 : i + 2 + length]
            i += 2 + length
            if kind == 7:
                out[name] = value.decode("utf-8", "replace")
        elif kind in _FIXED:
            i += _FIXED[kind]
        else:
            raise EventStreamError(f"Upstream sent a malformed event-stream frame: unknown header type {kind}")
        if i > end:
            raise EventStreamError("Upstream sent a malformed event-stream frame: truncated header")
    return out


class EventStreamDecoder:
    """`application/vnd.amazon.eventstream`: length-prefixed binary frames, each with two CRC32 checksums.

    Frame: total length, headers length, prelude CRC, headers, payload, message CRC (over every byte before
    it). Each frame becomes one (name, payload) pair: an event is named by its `:event-type` header
    (`contentBlockDelta`); an exception by `exception:` + its `:exception-type` (`exception:throttlingException`)
    with the JSON payload; an error message by `error:` + its `:error-code`, the payload being its
    `:error-message`. A checksum mismatch, an impossible length or a stream ending inside a frame raises
    `EventStreamError`.
    """

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, chunk: bytes) -> list[tuple[str | None, bytes]]:
        buf = self._buf
        buf += chunk
        events: list[tuple[str | None, bytes]] = []
        while len(buf) >= _PRELUDE.size:
            total, headers_len, prelude_crc = _PRELUDE.unpack_from(buf)
            # Checked before waiting for the rest: a JSON error body or a proxy's HTML page fails here at once.
            if zlib.crc32(buf[:8]) != prelude_crc:
                raise EventStreamError(
                    "Upstream sent a malformed event-stream frame: prelude checksum mismatch"
                    f" (starts {bytes(buf[:24])!r})"
                )
            if total < _MIN_FRAME or headers_len > min(total - _MIN_FRAME, _MAX_HEADERS):
                raise EventStreamError(
                    f"Upstream sent a malformed event-stream frame: length {total}, headers {headers_len}"
                )
            if total - _MIN_FRAME - headers_len > _MAX_PAYLOAD:
                raise EventStreamError(f"Upstream sent an event-stream frame of {total} bytes, over the limit")
            if len(buf) < total:
                break
            frame = bytes(buf[:total])
            del buf[:total]
            (message_crc,) = _CRC.unpack_from(frame, total - 4)
            if zlib.crc32(frame[: total - 4]) != message_crc:
                raise EventStreamError("Upstream sent a malformed event-stream frame: message checksum mismatch")
            start = _PRELUDE.size
            headers = _frame_headers(frame[start : start + headers_len])
            events.append(_named(headers, frame[start + headers_len : total - 4]))
        return events

    def close(self) -> list[tuple[str | None, bytes]]:
        if self._buf:
            left, self._buf = len(self._buf), bytearray()
            raise EventStreamError(f"Upstream ended the event stream inside a frame ({left} bytes unread)")
        return []


def _named(headers: dict[str, str], payload: bytes) -> tuple[str | None, bytes]:
    kind = headers.get(":message-type", "event")
    if kind == "exception":
        return "exception:" + headers.get(":exception-type", ""), payload
    if kind == "error":
        return "error:" + headers.get(":error-code", ""), headers.get(":error-message", "").encode("utf-8")
    return headers.get(":event-type"), payload


class Decoder(Protocol):
    def feed(self, chunk: bytes) -> list[tuple[str | None, bytes]]: ...

    def close(self) -> list[tuple[str | None, bytes]]: ...


# `Adapter.framing` -> its decoder.
DECODERS: Final[dict[str, type[Decoder]]] = {
    "sse": SSEDecoder,
    "ndjson": NDJSONDecoder,
    "eventstream": EventStreamDecoder,
}


def sse_event(payload: bytes) -> bytes:
    return b"data: " + payload + b"\n\n"
