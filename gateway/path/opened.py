"""A stream whose first event has arrived, before anything of it reaches the client: what a streamed
attempt hands the relay (gateway/path/relay.py), with what it holds until the stream ends."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Sequence
from typing import TYPE_CHECKING

from gateway.emulation.stops import Folded
from gateway.limits.admission import Ticket
from gateway.queue.gate import Slot
from gateway.upstream.client import Stream
from providers.base import CallContext
from wire.chat import ChatChunk
from wire.schema import Completion

if TYPE_CHECKING:
    from gateway.path.echo import Lead

# A stream chunk, of a completion or a chat request.
Chunk = Completion | ChatChunk


class Opened:
    """A stream whose first event has arrived: nothing has been sent to the client yet."""

    def __init__(
        self,
        chunks: AsyncGenerator[Chunk, None],
        first: Chunk | None,
        stream: Stream | None = None,
        *,
        ctx: CallContext,
        children: Sequence[Opened] = (),
        folded: Folded | None = None,
    ) -> None:
        self.chunks = chunks
        self.first = first
        self.stream = stream
        self.ctx = ctx  # this call's own context: its `created` is what the stream's chunks carry
        self.children = children  # the sub-streams an emulated fan-out merges
        self.folded = folded  # an emulation's: the tokens its stops held back and sent inside a later chunk
        self.quota: Ticket | None = None  # an alias target's provider/deployment quota, settled with the stream
        # The target whose in-flight count this stream holds until the relay ends it (None: none held).
        self.held: str | None = None
        self.slot: Slot | None = None  # its server's slot (max_concurrency), given back at the stream's end
        self.led: Lead | None = None  # chat's `echo`: its text in the chunks that began each choice

    def drop(self) -> None:
        """Close the upstream connection(s) at once (not returned to the pool half-read)."""
        if self.stream is not None:
            self.stream.close()
        for child in self.children:
            child.drop()

    def rewrite(self, each: Callable[[ChatChunk], ChatChunk]) -> None:
        """Every chunk of this chat stream, the first included, as `each` makes it: before the relay reads any."""
        if self.first is not None:
            self.first = each(self.first)  # type: ignore[arg-type]  # a chat stream's chunks are ChatChunks
        self.chunks = _mapped(self.chunks, each)  # type: ignore[arg-type]

    async def close(self) -> None:
        self.drop()
        await self.chunks.aclose()
        for child in self.children:
            await child.close()


async def _mapped(
    upstream: AsyncGenerator[ChatChunk, None], each: Callable[[ChatChunk], ChatChunk]
) -> AsyncGenerator[ChatChunk, None]:
    """A chat stream's chunks, each as `each` makes it; the upstream closed when this is."""
    try:
        async for c in upstream:
            yield each(c)
    finally:
        await upstream.aclose()
