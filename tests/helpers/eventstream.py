"""A minimal AWS event-stream *encoder* for tests: frames the recordings lack (exception frames, a
guardrail stop) are built from the documented layout, the same one the recorded Bedrock stream uses
(tests/fixtures/bedrock/converse_stream.eventstream). test_bedrock_eventstream.py proves it byte-exact on a recorded
frame before relying on it.

Frame: total length, headers length, CRC32 of those 8 bytes (all big-endian uint32), headers (name length
byte, name, type 7 = string, uint16 length, value), payload, CRC32 of everything before it.
"""

from __future__ import annotations

import json
import struct
import zlib
from typing import Any


def frame(headers: list[tuple[str, str]], payload: bytes) -> bytes:
    raw_headers = b""
    for name, value in headers:
        name_b, value_b = name.encode(), value.encode()
        raw_headers += bytes([len(name_b)]) + name_b + b"\x07" + struct.pack(">H", len(value_b)) + value_b
    total = 12 + len(raw_headers) + len(payload) + 4
    prelude = struct.pack(">II", total, len(raw_headers))
    message = prelude + struct.pack(">I", zlib.crc32(prelude)) + raw_headers + payload
    return message + struct.pack(">I", zlib.crc32(message))


def event(event_type: str, payload: dict[str, Any]) -> bytes:
    """An event frame with the headers in the order Bedrock sends them."""
    body = json.dumps(payload, separators=(",", ":")).encode()
    return frame([(":event-type", event_type), (":content-type", "application/json"), (":message-type", "event")], body)


def exception(exception_type: str, message: str) -> bytes:
    """An exception frame (`:message-type: exception`), as the SDKs parse them."""
    body = json.dumps({"message": message}).encode()
    return frame(
        [
            (":exception-type", exception_type),
            (":content-type", "application/json"),
            (":message-type", "exception"),
        ],
        body,
    )


def split_frames(raw: bytes) -> list[bytes]:
    """A recorded stream cut into its frames, by the length each prelude gives."""
    out: list[bytes] = []
    i = 0
    while i < len(raw):
        (total,) = struct.unpack_from(">I", raw, i)
        out.append(raw[i : i + total])
        i += total
    return out
