"""A stored answer served: `replayed` for a hit or a coalesced request, as any request is answered, and
`answered` for a buffered hit that no rate limit counts, answered in `Pipeline.early` before any task is made.

What every such answer repeats is made once: the header lines of a target and outcome (encoded, bounded like
the endpoint's own encoded values, since a target can carry a client's model name), and the JSON of the model
the client asked for. Per hit, only the stored client bytes behind this request's id, time and model
(`entry.client_body`) and the `Age` line are new; no call context, headers dict or answer struct is built.
"""

from __future__ import annotations

from typing import Final

from gateway.cache.chat import replay
from gateway.cache.entry import Entry, buffered_body, client_body, replay_stream
from gateway.cache.job import JobLike, Make, R
from gateway.limits.admission import Admission
from gateway.limits.rateheaders import Lines
from gateway.ops.metrics import Record
from gateway.server.values import header_value
from providers.base import CallContext

# Per (provider, target, outcome): the lines before `Age`, in the order `Lookup.replay` gives its headers.
_LINES: Final[dict[tuple[str, str, str], Lines]] = {}
_LINES_MAX: Final = 1024


def _lines(provider: str, target: str, state: str) -> Lines:
    if len(_LINES) >= _LINES_MAX:
        _LINES.clear()  # client-chosen model names cannot grow it
    lines = _LINES[(provider, target, state)] = [
        (b"x-gateway-provider", header_value(provider)),
        (b"x-gateway-model", header_value(target)),
        (b"x-gateway-attempts", b"0"),
        (b"x-gateway-cache", header_value(state)),
    ]
    return lines


def answered(
    entry: Entry, state: str, now: float, rec: Record, id_: str, created: int, model: str, chat: bool
) -> tuple[bytes, Lines]:
    """`entry` as this request's buffered answer (`now` on the cache's clock, for `Age`): its body, and its header
    lines (a new list: the endpoint appends to it). `rec` is filled as `Lookup.replay` fills it."""
    provider, target = entry.provider, entry.target
    rec.provider, rec.target, rec.attempts, rec.usage = provider, target, 0, entry.usage
    rec.cached = True
    body = entry.body
    sent = client_body(body, id_, created, model, chat) if body is not None else None
    if sent is None:  # an entry of events (a stored stream): merged into one answer
        sent = buffered_body(entry, CallContext(id=id_, created=created, model=model, chat=chat))
    head = _LINES.get((provider, target, state)) or _lines(provider, target, state)
    return sent, [*head, (b"age", b"%d" % max(int(now - entry.stored), 0))]


def replayed(entry: Entry, state: str, now: float, admission: Admission, job: JobLike, rec: Record, make: Make[R]) -> R:
    """`entry` as the answer to `job` (a hit, or a coalesced request; `now` on the cache's clock, for `Age`),
    buffered or streamed as the request asks, made by `make`; `rec` filled as the upstream's answer fills it."""
    rec.provider, rec.target, rec.attempts, rec.usage = entry.provider, entry.target, 0, entry.usage
    rec.cached = True
    headers = {
        "x-gateway-provider": entry.provider,
        "x-gateway-model": entry.target,
        "x-gateway-attempts": "0",
        "x-gateway-cache": state,
        "age": str(max(int(now - entry.stored), 0)),
    }
    ticket = job.ticket
    if ticket is not None:  # none for a hit no rate limit counts (`Pipeline.early`)
        admission.settle(ticket, 0)
    limits = None if ticket is None else ticket.headers
    req, ctx = job.req, job.ctx
    if not req.stream:
        return make(headers, body=buffered_body(entry, ctx), limits=limits)
    want_usage = bool(req.stream_options and req.stream_options.include_usage)
    return make(headers, stream=(replay if ctx.chat else replay_stream)(entry, ctx, want_usage), limits=limits)


__all__ = ["answered", "replayed"]
