"""What a cache entry holds, and how it becomes a buffered answer or a stream again.

An entry keeps the choices as the upstream sent them: one event per stream chunk (the chunk boundaries
are replayed as they came), or one event holding every choice of a buffered answer. Either serves
either kind of request: a buffered request gets the events' choices merged per index (text, logprobs and
finish reasons concatenated as the stream delivered them), a streamed one gets one chunk per event.
A buffered answer stored as the pipeline answered it keeps its client bytes instead (`body`, whole: cut
when served, not when stored), so a buffered hit sends them from `choices` on behind its own id, time
and model. In memory an entry is kept as it is (never changed once stored: requests share it); in Redis
it is kept encoded (`dump`), versioned and bounded, and anything that does not decode as this version's
entry is a miss, never an error.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Final

import msgspec

from gateway.upstream.framing import DONE, sse_event
from providers.base import CallContext
from wire.schema import Choice, Completion, Logprobs, Usage, encode

VERSION: Final = 2
MAGIC: Final = b"gwc2:"


class Entry(msgspec.Struct, array_like=True, forbid_unknown_fields=True, gc=False):  # holds no cycle
    version: int
    stored: float  # wall-clock seconds when the answer was stored (for `Age` and `max-age`)
    model: str  # the model the client asked for (for `DELETE /admin/cache?model=`)
    provider: str  # which target served the stored answer
    target: str
    usage: Usage | None
    events: list[list[Choice]]
    system_fingerprint: str | None = None
    body: bytes | None = None  # a buffered answer's client JSON, whole (then `events` is empty)


class _Rest(msgspec.Struct):
    choices: list[Choice]


_HEAD: Final = b'{"object":"text_completion","id":%s,"created":%d,"model":%s%s'
_json = msgspec.json.encode
_rest = msgspec.json.Decoder(_Rest).decode


def client_body(body: bytes, ctx: CallContext) -> bytes | None:
    """A stored `body` as this request's answer: its id, time and model, then the stored bytes from their
    `choices` on (None if they have none)."""
    at = body.find(b',"choices":')  # a bare `"` only opens or closes a string: the first is the field
    return _HEAD % (_json(ctx.id), ctx.created, _json(ctx.model), body[at:]) if at > 0 else None


def events_of(entry: Entry) -> Entry:
    """`entry` with its `events` (a batch or a stream replays them): when it holds client bytes, a copy with
    them decoded (a stored entry is shared, never changed)."""
    if entry.body is not None and not entry.events:
        return msgspec.structs.replace(entry, events=[_rest(entry.body).choices])
    return entry


# What an entry holding a buffered answer's client bytes counts besides them (its times, names, usage and
# fingerprint): a little more than they take encoded, so counting its `body` alone is close to its encoding.
OVERHEAD: Final = 128


def size(entry: Entry) -> int:
    """What `entry` counts against `max_entry_bytes` and the memory store's `max_bytes`: its client bytes plus
    `OVERHEAD`, or the length of its encoding (`dump`) when it holds events."""
    body = entry.body
    return len(body) + OVERHEAD if body is not None else len(dump(entry))


encode_entry = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(Entry).decode


def dump(entry: Entry) -> bytes:
    return MAGIC + encode_entry(entry)


def load(raw: bytes | None, max_bytes: int) -> Entry | None:
    """The entry in `raw`, or None for anything else: absent, too large, foreign, corrupt, another version."""
    if raw is None or len(raw) > max_bytes or not raw.startswith(MAGIC):
        return None
    try:
        entry = _decode(memoryview(raw)[len(MAGIC) :])
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError, TypeError):
        return None
    return entry if entry.version == VERSION else None


def merged(events: list[list[Choice]]) -> list[Choice]:
    """The events' choices as one answer: per index, in the order the events delivered them."""
    if len(events) == 1:
        return events[0]
    out: dict[int, Choice] = {}
    for event in events:
        for ch in event:
            have = out.get(ch.index)
            if have is None:
                out[ch.index] = msgspec.structs.replace(
                    ch, logprobs=_copy(ch.logprobs) if ch.logprobs is not None else None
                )
                continue
            have.text += ch.text
            if ch.logprobs is not None:
                if have.logprobs is None:
                    have.logprobs = _copy(ch.logprobs)
                else:
                    _extend(have.logprobs, ch.logprobs)
            if ch.finish_reason is not None:
                have.finish_reason = ch.finish_reason
            if ch.prompt_logprobs is not None and have.prompt_logprobs is None:
                have.prompt_logprobs = ch.prompt_logprobs
            # vLLM's and SGLang's token-native fields: each chunk's `token_ids` are its own delta.
            if ch.token_ids is not None:
                have.token_ids = [*(have.token_ids or ()), *ch.token_ids]  # new list: the entry stays as stored
            if ch.prompt_token_ids is not None and have.prompt_token_ids is None:
                have.prompt_token_ids = ch.prompt_token_ids
            if ch.stop_reason is not None:
                have.stop_reason = ch.stop_reason
    return [out[i] for i in sorted(out)]


def _copy(lp: Logprobs) -> Logprobs:
    top = list(lp.top_logprobs) if lp.top_logprobs is not None else None
    return Logprobs(list(lp.tokens), list(lp.token_logprobs), top, list(lp.text_offset))


def _extend(into: Logprobs, more: Logprobs) -> None:
    into.tokens.extend(more.tokens)
    into.token_logprobs.extend(more.token_logprobs)
    into.text_offset.extend(more.text_offset)
    if more.top_logprobs is not None:
        if into.top_logprobs is None:
            into.top_logprobs = [None] * (len(into.tokens) - len(more.tokens))
        into.top_logprobs.extend(more.top_logprobs)
    elif into.top_logprobs is not None:
        into.top_logprobs.extend([None] * len(more.tokens))


def answer(entry: Entry, template: Completion) -> Completion:
    """The entry as a buffered answer with `template`'s id, time and model."""
    template.choices = merged(entry.events)
    template.usage = entry.usage
    template.system_fingerprint = entry.system_fingerprint
    return template


def buffered_body(entry: Entry, ctx: CallContext) -> bytes:
    """The entry as this request's buffered answer, in client JSON: its stored bytes when it has them."""
    if entry.body is not None:
        sent = client_body(entry.body, ctx)
        if sent is not None:
            return sent
    return encode(answer(events_of(entry), ctx.completion([])))


def finished(events: list[list[Choice]], expected: int) -> bool:
    """Whether every expected choice got its finish reason (a stream that ended normally)."""
    done: set[int] = set()
    for event in events:
        for ch in event:
            if ch.finish_reason is not None:
                done.add(ch.index)
    return len(done) >= expected


async def replay_stream(entry: Entry, ctx: CallContext, want_usage: bool) -> AsyncIterator[bytes]:
    """The stored answer as the upstream streamed it: one chunk per stored event, the usage, [DONE]."""
    for event in events_of(entry).events:
        yield sse_event(encode(ctx.completion(event, system_fingerprint=entry.system_fingerprint)))
    if want_usage and entry.usage is not None:
        yield sse_event(encode(ctx.completion([], entry.usage)))
    yield DONE


__all__ = [
    "MAGIC",
    "OVERHEAD",
    "VERSION",
    "Entry",
    "answer",
    "buffered_body",
    "client_body",
    "dump",
    "events_of",
    "encode_entry",
    "finished",
    "load",
    "merged",
    "replay_stream",
    "size",
]
