"""AWS Bedrock tests' shared setup: the adapter as the router builds it, credentials and the field lists."""

from __future__ import annotations

from datetime import UTC, datetime

from gateway.upstream.framing import EventStreamDecoder
from providers.bedrock import BedrockAdapter
from tests.helpers.adapters import chunked

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
ADAPTER = BedrockAdapter(clock=lambda: NOW)


STREAM = "bedrock/converse_stream.eventstream"


def decode_frames(raw: bytes, size: int) -> list[tuple[str | None, bytes]]:
    decoder = EventStreamDecoder()
    return [e for part in chunked(raw, size) for e in decoder.feed(part)] + decoder.close()
