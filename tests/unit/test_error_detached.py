"""An error a frame keeps after its `except` block holds no frame: no reference cycle through tracebacks.

The failover loop and the stream relay keep the error of a failed attempt to decide the next step. A
traceback holds the frames it passed, and on Python 3.12 and later a finished callee's frame holds its
caller's, so an error kept with any traceback in its chain (its own, or its cause's or context's) put the
keeping frame in a cycle that only the collector frees, on every request that failed over
(tests/server/test_no_cycles.py finds them under load). Here the chain's inner error is raised in the
keeping frame itself, which makes the same cycle on every Python version.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from contextlib import contextmanager

from wire.errors import GatewayError, UpstreamError


class Marker:
    """A local of the keeping frame: alive as long as that frame is."""


@contextmanager
def collector_off() -> Iterator[None]:
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def keep(detach: bool) -> tuple[weakref.ref[Marker], GatewayError]:
    marker = Marker()
    try:
        try:
            raise OSError("connection reset")
        except OSError as inner:
            raise UpstreamError("upstream failed", code="upstream_error") from inner
    except GatewayError as exc:
        kept = exc.detached() if detach else exc.with_traceback(None)
    return weakref.ref(marker), kept


def test_the_kept_error_and_its_chain_lose_their_tracebacks_not_their_causes() -> None:
    _, kept = keep(detach=True)
    assert kept.__traceback__ is None
    cause = kept.__cause__
    assert isinstance(cause, OSError) and str(cause) == "connection reset"  # the chain is kept, for the log
    assert cause.__traceback__ is None
    assert kept.message == "upstream failed"


def test_a_frame_that_keeps_a_detached_error_is_freed_without_the_collector() -> None:
    with collector_off():
        ref, kept = keep(detach=True)
        assert ref() is None and kept.__cause__ is not None  # gone, though the error and its cause live on
        # Without its chain's tracebacks cut too, the cause's traceback holds the frame: a cycle.
        ref, kept = keep(detach=False)
        del kept
        assert ref() is not None
    gc.collect()
    assert ref() is None


def test_a_chain_made_into_a_loop_by_hand_ends() -> None:
    a, b = GatewayError("a"), GatewayError("b")
    a.__cause__, b.__cause__ = b, a
    assert a.detached() is a
