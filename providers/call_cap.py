"""The tool calls one chat answer may carry: at most MAX_CALLS, in a stream all its choices together, in a
buffered answer each choice.

An upstream's call costs the gateway far more than its bytes: `{}` in a buffered answer's `tool_calls` (3 bytes)
becomes a call with an id made for it, some 100 bytes in the client's answer and a few hundred in memory while it
is built, so the 64 MiB of `caps.upstream_body_bytes` would hold gigabytes' worth. A stream keeps an entry for each
call it starts (its place in the answer, whether its id was sent) for as long as it runs, and some 60,000
OpenAI-wire call pieces fit in one 1 MiB event. Past the cap the answer is an invalid one (502
`invalid_upstream_response`, tried elsewhere; an error event once a stream started), as one of the wrong shape is.
"""

from __future__ import annotations

from collections.abc import Hashable, Sized
from typing import Any, Final

from providers.envelope import Unreadable

# 128 choices (the most one request asks for) of 128 calls each (OpenAI's most tools per request).
MAX_CALLS: Final = 16_384


def room_for_call(calls: Sized) -> None:
    """Before a stream's new call joins `calls` (the adapter's entries so far): Unreadable once it is full."""
    if len(calls) >= MAX_CALLS:
        raise Unreadable(f"a stream that starts more than {MAX_CALLS} tool calls")


class StreamCalls:
    """A stream's tool calls, numbered as the client sees them: each upstream block that starts one gets the
    next number, and the block's argument pieces go to it. A block index the stream already used (an upstream's
    slip) starts a call of its own too, with its own id and name: given the number of the call before it, the
    client would merge the two into one. Its later pieces go to the newest call of that index."""

    __slots__ = ("_at", "_count")

    def __init__(self) -> None:
        self._at: dict[Hashable, int] = {}
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def start(self, block: Hashable) -> int:
        """The number of the call `block` starts; Unreadable once the stream has started MAX_CALLS."""
        room_for_call(self)
        self._at[block] = at = self._count
        self._count += 1
        return at

    def of(self, block: Hashable) -> int | None:
        """The number of the call whose pieces `block` carries; None for a block that started none."""
        return self._at.get(block)

    def other(self, block: Hashable) -> None:
        """`block` starts something other than a call: its pieces no longer go to an earlier call."""
        self._at.pop(block, None)


def stream_calls(state: dict[str, Any]) -> StreamCalls:
    """The stream's calls, kept in its `CallContext.state`."""
    calls: StreamCalls = state.setdefault("tool_index", StreamCalls())
    return calls


def held_calls(calls: Sized) -> None:
    """A buffered answer's choice's calls, before any is made a client's: Unreadable when they are too many."""
    if len(calls) > MAX_CALLS:
        raise Unreadable(f"a choice of {len(calls)} tool calls, more than {MAX_CALLS}")


__all__ = ["MAX_CALLS", "StreamCalls", "held_calls", "room_for_call", "stream_calls"]
