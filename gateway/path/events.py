"""An upstream stream's bytes as normalized chunks, as they arrive, up to the upstream's end-of-stream event.

`data: [DONE]` (every OpenAI-wire server, and a proxy in front of another kind) ends the answer, and so does the
event an adapter's parser marks as its kind's last (`CallContext.ended`: Anthropic's `message_stop`, Ollama's
`done`), whose chunk, if it makes one, is relayed: nothing after it is read or relayed, and the client's stream
ends there, whether or not the upstream then closes its body. The connection is settled (`Stream.settle`):
pooled once the rest of the body arrives, else closed. A stream that sends `caps.upstream_idle_stream_bytes`,
or goes on for `timeouts.stream_idle_ms`, with nothing for the client (keep-alives, comments, ignored events)
fails (`StreamIdle`).
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Callable
from typing import Final

from gateway.config import CapsConfig
from gateway.path.opened import Chunk
from gateway.upstream.client import Stream
from gateway.upstream.framing import DECODERS
from providers.base import CallContext
from wire.errors import UpstreamError, shown

# An adapter's stream-event parser (`parse_event`, or `parse_chat_event` on chat).
Parse = Callable[[str | None, bytes, CallContext], Chunk | None]

END: Final = b"[DONE]"
# The settings a `StreamIdle` names.
CAP: Final = "caps.upstream_idle_stream_bytes"
TIMEOUT: Final = "timeouts.stream_idle_ms"


class StreamIdle(UpstreamError):
    """A stream that went on sending without an event for the client: each read reset the read timeout, so
    only these caps ended it before `total_ms`. A failure of the target, like a stream broken mid-answer."""

    retryable = True

    def __init__(self, stream: Stream, went: str, setting: str) -> None:
        super().__init__(
            f"Upstream '{shown(stream.target) if stream.target else stream.provider}' {went} without an event "
            f"carrying text, a choice, usage or a finish ({setting})",
            code="upstream_stream_idle",
            cause="stream_idle",
            target=stream.target,
            provider=stream.provider,
        )


async def upstream_events(
    parse: Parse, framing: str, stream: Stream, ctx: CallContext, caps: CapsConfig, idle_s: float
) -> AsyncGenerator[Chunk, None]:
    """Upstream bytes -> normalized chunks, as they arrive, until the upstream's end-of-stream event; `idle_s`:
    the stream's time allowed since its last event that carried something (`Timeouts.stream_idle`)."""
    decoder = DECODERS[framing](max_event_bytes=caps.upstream_event_bytes)
    max_idle_bytes = caps.upstream_idle_stream_bytes
    reply = stream.reply
    chunks = stream.chunks()
    # The decoder's count of bytes when the last event that carried something came: the decoder counts what it
    # takes in, so the cap costs no call of its own (a chunk is at most 64 KiB: the cap is overshot by less).
    mark = 0
    # The idle time reads no clock while events carry something, so a busy stream pays nothing for it: a chunk
    # that carries something notes the reader's last wait (`Reply.last_wait`); the first chunk after it that
    # carries nothing takes as its spell's start the wait begun since, which began once that event was relayed
    # (the silence before a first keep-alive counts). Before any event, a spell starts with the body.
    at = reply.last_wait
    spell = -1  # `mark` when the current idle spell's start was taken
    since = 0.0
    working = ctx.working
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
        idle = decoder.fed - mark
        if idle and ctx.working != working:  # the model worked on what this route leaves out (its thinking)
            working = ctx.working
            mark = decoder.fed
            idle = 0
        if not idle:
            at = reply.last_wait
            continue
        # An event still arriving is bounded by the event cap, and may be the one that carries something.
        if idle > max_idle_bytes and idle - decoder.held() > max_idle_bytes:
            raise StreamIdle(stream, f"sent more than {max_idle_bytes} bytes of its stream", CAP)
        now = time.monotonic()
        if spell != mark:
            spell = mark
            waited = reply.last_wait
            # No wait since: this chunk came in the same read as the last event that carried something.
            since = waited if waited != at else now
        if now - since > idle_s:
            raise StreamIdle(stream, f"went more than {idle_s * 1000:.0f} ms", TIMEOUT)
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
