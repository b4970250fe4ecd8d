"""An upstream stream's bytes as normalized chunks, as they arrive, up to the upstream's end-of-stream event.

`data: [DONE]` (every OpenAI-wire server, and a proxy in front of another kind) ends the answer, and so does the
event an adapter's parser marks as its kind's last (`CallContext.ended`: Anthropic's `message_stop`, Ollama's
`done`), whose chunk, if it makes one, is relayed: nothing after it is read or relayed, and the client's stream
ends there, whether or not the upstream then closes its body. The connection is settled (`Stream.settle`):
pooled once the rest of the body arrives, else closed.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from typing import Final

from gateway.path.opened import Chunk
from gateway.upstream.client import Stream
from gateway.upstream.framing import DECODERS
from providers.base import CallContext

# An adapter's stream-event parser (`parse_event`, or `parse_chat_event` on chat).
Parse = Callable[[str | None, bytes, CallContext], Chunk | None]

END: Final = b"[DONE]"


async def upstream_events(
    parse: Parse, framing: str, stream: Stream, ctx: CallContext, max_event_bytes: int
) -> AsyncGenerator[Chunk, None]:
    """Upstream bytes -> normalized chunks, as they arrive, until the upstream's end-of-stream event."""
    decoder = DECODERS[framing](max_event_bytes=max_event_bytes)
    chunks = stream.chunks()
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
                yield c
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


__all__ = ["END", "Parse", "prepended", "upstream_events"]
