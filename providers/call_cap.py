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

from collections.abc import Sized
from typing import Final

from providers.envelope import Unreadable

# 128 choices (the most one request asks for) of 128 calls each (OpenAI's most tools per request).
MAX_CALLS: Final = 16_384


def room_for_call(calls: Sized) -> None:
    """Before a stream's new call joins `calls` (the adapter's entries so far): Unreadable once it is full."""
    if len(calls) >= MAX_CALLS:
        raise Unreadable(f"a stream that starts more than {MAX_CALLS} tool calls")


def held_calls(calls: Sized) -> None:
    """A buffered answer's choice's calls, before any is made a client's: Unreadable when they are too many."""
    if len(calls) > MAX_CALLS:
        raise Unreadable(f"a choice of {len(calls)} tool calls, more than {MAX_CALLS}")


__all__ = ["MAX_CALLS", "held_calls", "room_for_call"]
