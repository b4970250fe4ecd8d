"""AWS Bedrock: the event-stream decoder against the real recorded ConverseStream body (tests/fixtures/bedrock).

Frames the recording lacks (exception frames, non-string header types) are built with tests/helpers/eventstream.py,
which is first shown to reproduce a recorded frame byte for byte."""

from __future__ import annotations

import json
import struct
import zlib

import pytest

from gateway.upstream.framing import DECODERS, EventStreamDecoder, EventStreamError
from providers.bedrock import BedrockAdapter
from tests.helpers.adapters import chunked
from tests.helpers.eventstream import event, exception, frame, split_frames
from tests.helpers.recordings import fixture_bytes
from tests.providers.bedrock_setup import STREAM, decode_frames
from wire.errors import UpstreamError

RECORDED_NAMES = ["messageStart"] + ["contentBlockDelta"] * 29 + ["contentBlockStop", "messageStop", "metadata"]


def test_recorded_stream_decodes_into_its_33_events() -> None:
    events = decode_frames(fixture_bytes(STREAM), 100_000)
    assert [name for name, _ in events] == RECORDED_NAMES
    assert json.loads(events[0][1])["role"] == "assistant"
    assert json.loads(events[1][1])["delta"] == {"text": "The"}
    assert json.loads(events[-2][1])["stopReason"] == "end_turn"
    assert json.loads(events[-1][1])["usage"] == {
        "inputTokens": 13,
        "outputTokens": 82,
        "serverToolUsage": {},
        "totalTokens": 95,
    }


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 11, 12, 13, 16, 64, 181, 333, 4096])
def test_recorded_stream_in_odd_chunks(size: int) -> None:
    assert decode_frames(fixture_bytes(STREAM), size) == decode_frames(fixture_bytes(STREAM), 100_000)


def test_recorded_stream_split_at_every_byte() -> None:
    raw = fixture_bytes(STREAM)
    whole = decode_frames(raw, len(raw))
    for cut in range(1, len(raw)):
        decoder = EventStreamDecoder()
        assert decoder.feed(raw[:cut]) + decoder.feed(raw[cut:]) + decoder.close() == whole


def test_the_test_encoder_reproduces_recorded_frames_byte_for_byte() -> None:
    frames = split_frames(fixture_bytes(STREAM))
    assert len(frames) == 33
    for raw, (name, payload) in zip(frames, decode_frames(fixture_bytes(STREAM), 100_000), strict=True):
        assert name is not None
        assert event(name, json.loads(payload)) == raw


def test_a_corrupt_payload_byte_fails_the_message_checksum() -> None:
    raw = bytearray(fixture_bytes(STREAM))
    raw[181 + 120] ^= 0x01  # inside the second frame's payload
    decoder = EventStreamDecoder()
    with pytest.raises(EventStreamError, match="message checksum mismatch") as info:
        for part in chunked(bytes(raw), 50):
            decoder.feed(part)
    assert isinstance(info.value, UpstreamError)
    assert info.value.retryable is True
    assert info.value.status == 502


def test_a_corrupt_length_fails_the_prelude_checksum_before_waiting_for_the_frame() -> None:
    raw = bytearray(fixture_bytes(STREAM))
    raw[3] ^= 0x40  # the first frame's total length
    with pytest.raises(EventStreamError, match="prelude checksum mismatch"):
        EventStreamDecoder().feed(bytes(raw[:12]))


def test_a_json_body_is_not_an_event_stream() -> None:
    # What Bedrock answers (HTTP 200) to a path it cannot route (BerriAI/litellm#28551).
    body = b'{"Output":{"__type":"com.amazon.coral.service#UnknownOperationException"},"Version":"1.0"}'
    with pytest.raises(EventStreamError, match=r"prelude checksum mismatch \(starts b'\{\"Output"):
        EventStreamDecoder().feed(body)


def test_impossible_lengths_are_refused() -> None:
    prelude = struct.pack(">II", 8, 0)
    with pytest.raises(EventStreamError, match="length 8"):
        EventStreamDecoder().feed(prelude + struct.pack(">I", zlib.crc32(prelude)))
    prelude = struct.pack(">II", 40, 30)
    with pytest.raises(EventStreamError, match="headers 30"):
        EventStreamDecoder().feed(prelude + struct.pack(">I", zlib.crc32(prelude)))


def test_a_stream_cut_inside_a_frame_raises_on_close() -> None:
    raw = fixture_bytes(STREAM)
    decoder = EventStreamDecoder()
    assert [n for n, _ in decoder.feed(raw[:-10])] == RECORDED_NAMES[:-1]
    with pytest.raises(EventStreamError, match=r"inside a frame \(229 bytes unread\)"):
        decoder.close()


def test_exception_and_error_frames_are_named_by_their_type() -> None:
    raw = exception("throttlingException", "Too many requests, please wait before trying again.")
    error = frame([(":message-type", "error"), (":error-code", "InternalFailure"), (":error-message", "boom")], b"")
    assert decode_frames(raw + error, 9) == [
        ("exception:throttlingException", b'{"message": "Too many requests, please wait before trying again."}'),
        ("error:InternalFailure", b"boom"),
    ]


def test_non_string_headers_are_skipped() -> None:
    def header(name: str, kind: int, value: bytes) -> bytes:
        return bytes([len(name)]) + name.encode() + bytes([kind]) + value

    headers = (
        header(":event-type", 7, struct.pack(">H", 8) + b"metadata")
        + header("t", 0, b"")
        + header("f", 1, b"")
        + header("b", 2, b"\x01")
        + header("s", 3, b"\x00\x02")
        + header("i", 4, b"\x00\x00\x00\x03")
        + header("l", 5, b"\x00" * 8)
        + header("raw", 6, struct.pack(">H", 3) + b"xyz")
        + header("ts", 8, b"\x00" * 8)
        + header("id", 9, b"\x00" * 16)
    )
    payload = b"{}"
    total = 12 + len(headers) + len(payload) + 4
    prelude = struct.pack(">II", total, len(headers))
    message = prelude + struct.pack(">I", zlib.crc32(prelude)) + headers + payload
    raw = message + struct.pack(">I", zlib.crc32(message))
    assert decode_frames(raw, 5) == [("metadata", b"{}")]
    bad = message.replace(bytes([2]) + b"\x01", bytes([42]) + b"\x01", 1)
    bad_raw = bad + struct.pack(">I", zlib.crc32(bad))
    with pytest.raises(EventStreamError, match="unknown header type 42"):
        EventStreamDecoder().feed(bad_raw)


def test_the_pipeline_picks_the_decoder_by_framing() -> None:
    assert BedrockAdapter.framing == "eventstream"
    assert DECODERS["eventstream"] is EventStreamDecoder
