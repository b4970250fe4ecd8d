"""A buffered hit that no rate limit counts, answered in `Pipeline.early` before any task is made.

What every such answer repeats is made once: the header lines of a target and outcome (encoded, bounded like
the endpoint's own encoded values, since a target can carry a client's model name), and the JSON of the model
the client asked for. Per hit, only the stored client bytes behind this request's id, time and model
(`entry.client_body`) and the `Age` line are new; no call context, headers dict or answer struct is built.
"""

from __future__ import annotations

from typing import Final

from gateway.cache.entry import Entry, buffered_body, client_body
from gateway.limits.admission import Lines
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


__all__ = ["answered"]
