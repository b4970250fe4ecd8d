"""The tool calls one streamed chat answer may start: at most MAX_STREAMED_CALLS, all its choices together.

An adapter keeps an entry for each call a stream starts (its place among the answer's calls, or whether its id
was sent yet), for as long as the stream runs; nothing else of what a stream relays is held. An upstream that
starts call after call at new indexes (some 60,000 OpenAI-wire call pieces fit in one 1 MiB event) would grow
that table without end: past the cap its stream is an invalid answer (502 `invalid_upstream_response`, or an
error event once the stream started), as an event of the wrong shape is.
"""

from __future__ import annotations

from collections.abc import Sized
from typing import Final

from providers.envelope import Unreadable

# 128 choices (the most one request asks for) of 128 calls each (OpenAI's most tools per request).
MAX_STREAMED_CALLS: Final = 16_384


def room_for_call(calls: Sized) -> None:
    """Before a stream's new call joins `calls` (the adapter's entries so far): Unreadable once it is full."""
    if len(calls) >= MAX_STREAMED_CALLS:
        raise Unreadable(f"a stream that starts more than {MAX_STREAMED_CALLS} tool calls")


__all__ = ["MAX_STREAMED_CALLS", "room_for_call"]
