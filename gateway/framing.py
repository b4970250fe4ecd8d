"""Stream framing, parsed once for every provider: server-sent events and NDJSON.

The decoders are incremental: they take whatever byte chunks the socket yields and return complete
events, so a stream is relayed as it arrives. Tolerated on purpose: `data:` with or without the space
(TGI omits it), CRLF line ends (Gemini), comment lines and blank keep-alives (DeepSeek under load).
"""

from __future__ import annotations

from typing import Final

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


def sse_event(payload: bytes) -> bytes:
    return b"data: " + payload + b"\n\n"
