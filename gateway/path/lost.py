"""Upstream calls a request paid for and did not use: hedges that lost, and the calls of a client gone.

The failover loop names every hedged call it lets go of (`Run._let_go`): the loser of a race, or, when the
client left during a hedge, each call then running. The upstream took each one's prompt and generated until
the call was cancelled, or answered in full after the winner: each is booked beside the request, at its own
target's price, against the same key (`Record.lost`: the usage store, the budgets and the ledger read it,
docs/ledger.md "Hedges"). A call cut before the gateway sent it (a hedge started a moment before the other
answered, still waiting for its turn) cost nothing, and is not booked.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

from gateway.limits import tokens
from gateway.ops.metrics import Lost, Record
from gateway.path.attempt import Answer, Job
from gateway.path.opened import Opened
from gateway.upstream.plan import Route
from wire.schema import Usage


def estimated(job: Job, chunks: int) -> Usage:
    """Usage for a stream the upstream reported none for: the prompt as admission estimated it (or as
    gateway/limits/tokens.py estimates it), and one output token per chunk sent (as a cancelled stream is charged)."""
    ticket = job.ticket
    prompt = ticket.prompt if ticket is not None and ticket.prompt else tokens.request_tokens(job.req)
    return Usage(prompt_tokens=prompt, completion_tokens=chunks, total_tokens=prompt + chunks)


def losses(job: Job, rec: Record) -> Callable[[Route, object, bool], None] | None:
    """What books on `rec` each hedged call of `job` that did not serve it (the failover loop's `lost`); None
    when its plan does not hedge (no closure made for every other request)."""
    if job.plan.policy.hedge_after_ms is None:
        return None

    def lost(route: Route, value: object, first: bool) -> None:
        if value is None:
            called = job.called
            # Cancelled while it ran: the first of the race ran `hedge_after_ms`, and was sent; a later one
            # only if it got as far as its upstream call (the latest call made is its own).
            if called is None or not (first or called.key == route.key):
                return
            usage = estimated(job, 0)  # what it generated before the cut is not known: its prompt
        elif isinstance(value, Opened):
            # Read to its first event: its prompt and one chunk, unless that event reported its usage.
            first_event = value.first
            reported = first_event.usage if first_event is not None else None
            usage = reported or estimated(job, 1)
        else:
            usage = cast(Answer, value).usage or estimated(job, 0)  # an answer in full, after the winner's
        entry = Lost(route.provider, route.key, usage.prompt_tokens, usage.completion_tokens)
        if rec.lost is None:
            rec.lost = [entry]
        else:
            rec.lost.append(entry)

    return lost


def left(job: Job, rec: Record) -> int:
    """The tokens charged to a request whose client left: none before an upstream was asked (`job.called`);
    after, its prompt, booked as its estimated usage on that target: the upstream took the prompt (and may have
    generated), and charging nothing would let a tenant's abandoned requests pass every limit. Left during a
    hedge, each other call then running is booked beside it (`losses`), the latest one being this booking."""
    called = job.called
    if called is None:
        return 0
    estimate = estimated(job, 0)
    rec.usage, rec.usage_estimated = estimate, True
    rec.provider, rec.target = called.provider, called.key
    gone = rec.lost
    if gone:
        for i, entry in enumerate(gone):
            if entry.target == called.key and entry.completion_tokens == 0:
                del gone[i]  # the request's own booking, above
                break
        if not gone:
            rec.lost = None
    return estimate.total_tokens
