"""Coalescing: a request identical to one in flight waits for that one's answer instead of asking the upstream.

It waits no longer than its own deadline (its `inference_timeout`, else its plan's `total_ms`: the alias's or
the provider's timeouts, not the global ones), and never on another tenant's client: the request it waits
for (its leader) is followed through its stream, and a leader whose client has not taken a chunk for
`PATIENCE_S`, or that has waited that long for a queue slot (its class and tenant's turn, not theirs:
path/attempt.py), stops leading. Its waiting requests then wake: the first asks the upstream in its place
and leads, the others wait for that one (docs/cache.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Final, Protocol

from gateway.cache.batch import assembled
from gateway.cache.entry import Entry
from gateway.upstream.plan import Plan
from wire.errors import GatewayError
from wire.schema import CompletionRequest

# How long a waiting request lets its leader's client take one chunk of the leader's stream. A client reading
# at any pace takes a chunk in far less (the socket's buffers absorb the rest); one that has stopped reading
# never does. Past it, the waiting requests no longer wait on that client.
PATIENCE_S: Final = 1.0


class Leader(Protocol):
    """What a waiting request reads of the request it waits for (service.py `Lookup`)."""

    result: list[Entry] | None
    waiter: asyncio.Future[Entry | None] | None
    blocked: float  # the loop's time since which its client has been taking a chunk, or it waited for a slot; 0: none

    def abandon(self) -> None: ...


def deadline_of(req: CompletionRequest, plan: Plan) -> float:
    """When (the loop's time) a request must stop waiting: its own `inference_timeout`, else its plan's total."""
    total = plan.timeouts.total
    t = req.inference_timeout
    if isinstance(t, (float, int)) and t < total:
        total = float(t)
    return asyncio.get_running_loop().time() + total


async def coalesced(
    inflight: Mapping[bytes, Leader], ahead: Leader, key: bytes, n: int, deadline: float
) -> Entry | None:
    """The answer of the identical request in flight (`ahead`, under `key` in `inflight`) by `deadline`; None
    when this request must ask itself: `ahead` failed, or its client stopped reading and no other request
    asked in its place before this one (then this one does, and those still waiting wait for it)."""
    while True:
        entry = await wait_for(ahead, n, deadline)
        if entry is not None:
            return entry
        follow = inflight.get(key) if ahead.blocked else None
        if follow is None:
            return None
        ahead = follow


async def wait_for(ahead: Leader, n: int, deadline: float) -> Entry | None:
    """The answer of the identical request in flight, by `deadline` (a 504 after it); None when it has none to
    share: it failed, or its client has not taken a chunk of its stream for `PATIENCE_S` (then it no longer
    leads). Its future is made by the first request that waits: a request nobody waits for makes none."""
    if ahead.result is not None:
        return assembled(ahead.result, n)  # stored, its leader not yet gone from `inflight`
    loop = asyncio.get_running_loop()
    waiting = ahead.waiter
    if waiting is None:
        waiting = ahead.waiter = loop.create_future()
    while True:
        left = deadline - loop.time()
        if left <= 0:
            raise GatewayError(
                "The identical request in flight, whose answer this one waited for, did not answer in time",
                status=504,
                code="deadline_exceeded",
            )
        try:
            async with asyncio.timeout(min(left, PATIENCE_S)):
                return await asyncio.shield(waiting)
        except TimeoutError:
            blocked = ahead.blocked
            if blocked and loop.time() - blocked >= PATIENCE_S:
                ahead.abandon()  # every request waiting for it wakes, to the one that asks in its place
                return None


__all__ = ["PATIENCE_S", "Leader", "coalesced", "deadline_of", "wait_for"]
