"""Stream framing, parsed once for every provider: server-sent events, NDJSON and AWS event streams.

The decoders are incremental: they take whatever byte chunks the socket yields and return complete
events, so a stream is relayed as it arrives. Tolerated on purpose: `data:` with or without the space
(TGI omits it), the SSE standard's three line ends (LF; CRLF: Gemini; a CR alone) and its leading byte
order mark, comment lines and blank keep-alives (DeepSeek under load). The binary AWS event stream
(Bedrock's `application/vnd.amazon.eventstream`) is not tolerant: a frame whose checksum does not match
is a broken stream, never guessed at.
"""

from __future__ import annotations

import struct
import zlib
from typing import Final, Protocol

from wire.errors import UpstreamError

DONE: Final = b"data: [DONE]\n\n"

# The byte order mark a stream may begin with, which the SSE standard has a reader ignore.
BOM: Final = b"\xef\xbb\xbf"

# One line or event of a stream, after decoding: the gateway passes `caps.upstream_event_bytes`, whose
# default this equals. A line that never ends is refused here instead of growing without bound.
MAX_EVENT_BYTES: Final = 1024 * 1024


class EventTooLarge(UpstreamError):
    """A stream line or event went over the cap; the message names the cap, never the upstream's bytes."""

    # Like a stream broken mid-answer: another attempt may get a sane one.
    retryable = True

    def __init__(self, cap: int) -> None:
        super().__init__(
            f"Upstream sent a stream event larger than the cap of {cap} bytes (caps.upstream_event_bytes)",
            code="upstream_event_too_large",
            cause="answer_too_large",  # counted as the failure it is; the relay names the target
        )


class SSEDecoder:
    """Server-sent events, linear in its input: an unfinished line waits in a bytearray that only grows
    by what arrives, and each chunk is scanned once."""

    __slots__ = ("fed", "_pending", "_data", "_size", "_event", "_max", "_head", "_cr")

    def __init__(self, *, max_event_bytes: int = MAX_EVENT_BYTES) -> None:
        self.fed = 0  # bytes taken in (line ends as LF): what the stream's idle cap counts
        self._pending = bytearray()
        self._data: list[bytes] = []
        self._size = 0
        self._event: str | None = None
        self._max = max_event_bytes
        self._head: bytes | None = b""  # the stream's first bytes, until they tell whether a BOM begins it
        self._cr = False  # the last chunk ended with a CR: an LF that begins the next one ends no line of its own

    def feed(self, chunk: bytes) -> list[tuple[str | None, bytes]]:
        """Return the (event name, data) pairs completed by this chunk."""
        if self._head is not None:
            chunk = self._opening(chunk)
        if self._cr or 13 in chunk:  # an int: a memchr, where `b"\r" in` costs a general search
            chunk = self._lf(chunk)
        size = len(chunk)  # once: the loop below would ask per event
        self.fed += size
        events: list[tuple[str | None, bytes]] = []
        start = 0
        pending = self._pending
        if pending:
            nl = chunk.find(b"\n")
            if nl < 0:
                pending += chunk
                if len(pending) > self._max:
                    raise EventTooLarge(self._max)
                return events
            pending += chunk[:nl]
            if len(pending) > self._max:
                raise EventTooLarge(self._max)
            line = bytes(pending)
            pending.clear()
            self._line(line, events)
            start = nl + 1
        while True:
            nl = chunk.find(b"\n", start)
            if nl < 0:
                break
            # An event whole in the chunk, as nearly every upstream sends one: a `data: ` line, its blank line
            # right after it, nothing of an event before it. Taken in one step: the line-by-line
            # way below costs two calls and a partition per event and gives the same pair.
            end = nl + 1
            if (
                end < size
                and chunk[end] == 10
                and chunk.startswith(b"data: ", start)
                and not self._data
                and self._event is None
            ):
                if nl - start - 6 > self._max:
                    raise EventTooLarge(self._max)
                events.append((None, chunk[start + 6 : nl]))
                start = end + 1
                continue
            if nl == start and not self._data and self._event is None:
                start = end  # a blank line that ends no event (keep-alives, a flood): nothing to reset
                continue
            line = chunk[start:nl]
            start = nl + 1
            self._line(line, events)
        if start < size:
            if size - start > self._max:
                raise EventTooLarge(self._max)
            pending += chunk[start:]
        return events

    def _opening(self, chunk: bytes) -> bytes:
        """`chunk` without the BOM the stream begins with, if it does: kept, its first line would name no field
        and the first event (with the answer's first text) would be dropped."""
        chunk = self._head + chunk if self._head else chunk
        if len(chunk) < len(BOM) and BOM.startswith(chunk):
            self._head = chunk
            return b""
        self._head = None
        return chunk[len(BOM) :] if chunk.startswith(BOM) else chunk

    def _lf(self, chunk: bytes) -> bytes:
        """`chunk` with its line ends as LF: the standard's three (LF, CRLF, a CR alone) end a line alike."""
        if self._cr and chunk[:1] == b"\n":
            chunk = chunk[1:]  # a CRLF split between two chunks, its CR already taken for the line's end
        self._cr = chunk[-1:] == b"\r"
        return chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")

    def held(self) -> int:
        """Bytes of an event still arriving: its unfinished line and the `data:` it has so far."""
        return len(self._pending) + self._size

    def close(self) -> list[tuple[str | None, bytes]]:
        """Flush an event the upstream ended without a blank line (common before a close)."""
        self._head = None  # at most the start of a BOM
        events: list[tuple[str | None, bytes]] = []
        if self._pending:
            line = bytes(self._pending)
            self._pending.clear()
            self._line(line, events)
        self._line(b"", events)
        return events

    def _line(self, line: bytes, events: list[tuple[str | None, bytes]]) -> None:
        if not line:
            if self._data:
                events.append((self._event, b"\n".join(self._data)))
            self._data = []
            self._size = 0
            self._event = None
            return
        if line[:1] == b":":
            return
        field, _, value = line.partition(b":")
        if value[:1] == b" ":
            value = value[1:]
        if field == b"data":
            # Many short `data:` lines make one event too: the cap is on what the event joins to.
            self._size += len(value) + 1
            if self._size > self._max + 1:
                raise EventTooLarge(self._max)
            self._data.append(value)
        elif field == b"event":
            self._event = value.decode("utf-8", "replace")


class NDJSONDecoder:
    """One JSON value per line, linear in its input like `SSEDecoder`."""

    __slots__ = ("fed", "_pending", "_max")

    def __init__(self, *, max_event_bytes: int = MAX_EVENT_BYTES) -> None:
        self.fed = 0
        self._pending = bytearray()
        self._max = max_event_bytes

    def feed(self, chunk: bytes) -> list[tuple[str | None, bytes]]:
        self.fed += len(chunk)
        pending = self._pending
        if pending:
            nl = chunk.find(b"\n")
            if nl < 0:
                pending += chunk
                if len(pending) > self._max:
                    raise EventTooLarge(self._max)
                return []
            pending += chunk[:nl]
            lines = [bytes(pending), *chunk[nl + 1 :].split(b"\n")]
            pending.clear()
        else:
            lines = chunk.split(b"\n")
        rest = lines.pop()
        cap = self._max
        if len(rest) > cap:
            raise EventTooLarge(cap)
        pending += rest
        out: list[tuple[str | None, bytes]] = []
        for line in lines:
            if line.strip():
                if len(line) > cap:
                    raise EventTooLarge(cap)
                out.append((None, line))
        return out

    def held(self) -> int:
        return len(self._pending)

    def close(self) -> list[tuple[str | None, bytes]]:
        rest = bytes(self._pending)
        self._pending.clear()
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

    __slots__ = ("fed", "_buf", "_max")

    def __init__(self, *, max_event_bytes: int = MAX_EVENT_BYTES) -> None:
        self.fed = 0
        self._buf = bytearray()
        # The AWS SDKs allow 16 MiB per payload; the gateway's per-event cap, when lower, wins.
        self._max = min(_MAX_PAYLOAD, max_event_bytes)

    def feed(self, chunk: bytes) -> list[tuple[str | None, bytes]]:
        # Linear: a frame waits in the bytearray until whole (at most its checked length), and a frame
        # deleted from the front costs nothing per byte left (CPython's bytearray keeps an offset).
        buf = self._buf
        buf += chunk
        self.fed += len(chunk)
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
            if total - _MIN_FRAME - headers_len > self._max:
                raise EventTooLarge(self._max)
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

    def held(self) -> int:
        return len(self._buf)

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
    fed: int  # bytes taken in so far

    def __init__(self, *, max_event_bytes: int = MAX_EVENT_BYTES) -> None: ...

    def feed(self, chunk: bytes) -> list[tuple[str | None, bytes]]: ...

    def held(self) -> int:
        """Bytes of an event begun and not yet complete (at most about `max_event_bytes`)."""
        ...

    def close(self) -> list[tuple[str | None, bytes]]: ...


# `Adapter.framing` -> its decoder.
DECODERS: Final[dict[str, type[Decoder]]] = {
    "sse": SSEDecoder,
    "ndjson": NDJSONDecoder,
    "eventstream": EventStreamDecoder,
}


def sse_event(payload: bytes) -> bytes:
    return b"data: " + payload + b"\n\n"
