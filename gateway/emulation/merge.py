"""Sub-streams read together: each chunk handed on as it arrives, tagged with its sub-stream's index.

Completion and chat emulation both merge the streams of their sub-calls this way; what they do with a
chunk (re-index it, cut it at a stop, sum its usage) is theirs.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from typing import Generic, Protocol, TypeVar

from providers.envelope import Unreadable

ChunkT = TypeVar("ChunkT")
ChunkT_co = TypeVar("ChunkT_co", covariant=True)


class Opened(Protocol, Generic[ChunkT_co]):
    """One opened sub-call's stream: its first chunk, then the rest."""

    @property
    def first(self) -> ChunkT_co | None: ...

    @property
    def chunks(self) -> AsyncIterator[ChunkT_co]: ...


async def merged(opens: Sequence[Opened[ChunkT]]) -> AsyncGenerator[tuple[int, ChunkT], None]:
    """`(k, chunk)` in arrival order until every sub-stream has ended; a sub-stream's error is raised here.

    Close the generator (`contextlib.aclosing`) when leaving early: that cancels the readers still running.
    """
    # A chunk per sub-stream on average: a pump waits while the client is slower than its upstream, and the
    # upstream's socket pauses as a single stream's does. Unbounded, every upstream was read as fast as it
    # sent, and a client that read slowly (or not at all) had the gateway hold all of it, parsed.
    queue: asyncio.Queue[tuple[int, ChunkT | None | BaseException]] = asyncio.Queue(len(opens))

    async def pump(k: int, opened: Opened[ChunkT]) -> None:
        try:
            c = opened.first
            while c is not None:
                await queue.put((k, c))
                c = await anext(opened.chunks, None)
            await queue.put((k, None))
        except asyncio.CancelledError:
            raise  # the merge ended and nobody reads the queue: a put could wait for ever
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, which re-raises it
            await queue.put((k, exc))

    pumps = [asyncio.ensure_future(pump(k, o)) for k, o in enumerate(opens)]
    live = len(opens)
    try:
        while live:
            k, item = await queue.get()
            if item is None:
                live -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield k, item
    finally:
        for p in pumps:
            p.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)
        # What the pumps handed on that the merge did not take is let go of: an exception among it holds its
        # pump's frame through its traceback, and that frame the queue.
        while not queue.empty():
            queue.get_nowait()


def own_choice(index: int, asked: int) -> None:
    """A sub-stream's chunk is for a choice its call asked for (`asked` of them): another's would be relabelled
    as the call's own and merged into it, so it is an invalid stream event."""
    if not -1 < index < asked:
        raise Unreadable(f"a stream event for choice {index} of a call that asked for {asked}")
