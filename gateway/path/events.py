"""An upstream stream's bytes as normalized chunks, as they arrive, up to the upstream's end-of-stream event.

`data: [DONE]` (every OpenAI-wire server, and a proxy in front of another kind) ends the answer, and so does the
event an adapter's parser marks as its kind's last (`CallContext.ended`: Anthropic's `message_stop`, Ollama's
`done`), whose chunk, if it makes one, is relayed: nothing after it is read or relayed, and the client's stream
ends there, whether or not the upstream then closes its body. The connection is settled (`Stream.settle`):
pooled once the rest of the body arrives, else closed. A stream that sends `caps.upstream_idle_stream_bytes`
with nothing for the client in them (keep-alives, comments, ignored events) fails (`StreamIdle`).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from typing import Final

from gateway.config import CapsConfig
from gateway.path.opened import Chunk
from gateway.upstream.client import Stream
from gateway.upstream.framing import DECODERS
from providers.base import CallContext
from wire.errors import UpstreamError

# An adapter's stream-event parser (`parse_event`, or `parse_chat_event` on chat).
Parse = Callable[[str | None, bytes, CallContext], Chunk | None]

END: Final = b"[DONE]"


class StreamIdle(UpstreamError):
    """A stream that went on sending without an event for the client: each read reset the read timeout, so
    only this cap ended it before `total_ms`. A failure of the target, like a stream broken mid-answer."""

    retryable = True

    def __init__(self, stream: Stream, cap: int) -> None:
        super().__init__(
            f"Upstream '{stream.target or stream.provider}' sent more than {cap} bytes of its stream without an "
            "event carrying text, a choice, usage or a finish (caps.upstream_idle_stream_bytes)",
            code="upstream_stream_idle",
            cause="stream_idle",
            target=stream.target,
            provider=stream.provider,
        )


async def upstream_events(
    parse: Parse, framing: str, stream: Stream, ctx: CallContext, caps: CapsConfig
) -> AsyncGenerator[Chunk, None]:
    """Upstream bytes -> normalized chunks, as they arrive, until the upstream's end-of-stream event."""
    decoder = DECODERS[framing](max_event_bytes=caps.upstream_event_bytes)
    max_idle_bytes = caps.upstream_idle_stream_bytes
    chunks = stream.chunks()
    # The decoder's count of bytes when the last event that carried something came: the decoder counts what it
    # takes in, so the cap costs no call of its own (a chunk is at most 64 KiB: the cap is overshot by less).
    mark = 0
    async for chunk in chunks:
        for event, data in decoder.feed(chunk):
            if data == END:
                stream.settle()
                await chunks.aclose()  # here, not in a task of its own that the loop would make when it is collected
                return
            c = parse(event, data, ctx)
            if ctx.ended:
                # The upstream's last event, which may carry the answer's last content: settled before its chunk
                # is relayed, so that a slow client does not hold the upstream connection.
                stream.settle()
                await chunks.aclose()
                if c is not None:
                    yield c
                return
            if c is not None:
                if c.choices or c.usage is not None:
                    mark = decoder.fed
                yield c
        # An event still arriving is bounded by the event cap, and may be the one that carries something.
        if decoder.fed - mark > max_idle_bytes and decoder.fed - mark - decoder.held() > max_idle_bytes:
            raise StreamIdle(stream, max_idle_bytes)
    for event, data in decoder.close():
        c = parse(event, data, ctx)
        if c is not None:
            yield c


async def prepended(first: Chunk, rest: AsyncGenerator[Chunk, None]) -> AsyncGenerator[Chunk, None]:
    """`first`, then `rest`'s chunks (a chunk read ahead, put back); `rest` closed when this is."""
    try:
        yield first
        async for c in rest:
            yield c
    finally:
        await rest.aclose()


__all__ = ["END", "Parse", "StreamIdle", "prepended", "upstream_events"]
