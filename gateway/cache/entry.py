"""What a cache entry holds, and how it becomes a buffered answer or a stream again.

An entry keeps the choices as the upstream sent them: one event per stream chunk (the chunk boundaries
are replayed as they came), or one event holding every choice of a buffered answer. Either serves
either kind of request: a buffered request gets the events' choices merged per index (text, logprobs and
finish reasons concatenated as the stream delivered them), a streamed one gets one chunk per event.
A buffered answer stored as the pipeline answered it keeps its client bytes instead (`body`, whole: cut
when served, not when stored), so a buffered hit sends them from `choices` on behind its own id, time
and model. Such an entry is kept in memory as it is (never changed once stored: requests share it); an
entry of events is kept encoded (`dump`), in memory as in Redis, where it is versioned and bounded, and
anything that is not this version's entry, checked whole, is a miss, never an error.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable
from typing import Final

import msgspec

from gateway.upstream.framing import DONE, sse_event
from providers.base import CallContext
from wire.chat import ChatChoice, ChatCompletion
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
_CHAT_HEAD: Final = b'{"object":"chat.completion","id":%s,"created":%d,"model":%s%s'
_json = msgspec.json.encode
_rest = msgspec.json.Decoder(_Rest).decode
_as_completion = msgspec.json.Decoder(Completion).decode
_as_chat = msgspec.json.Decoder(ChatCompletion).decode
_CHAT: Final = b'{"object":"chat.completion",'  # how a stored chat answer's bytes begin (its tag first)


def client_body(body: bytes, id_: str, created: int, model: str, chat: bool) -> bytes | None:
    """A stored `body` as this request's answer: its id, time and model, then the stored bytes from their
    `choices` on (None if they have none)."""
    at = body.find(b',"choices":')  # a bare `"` only opens or closes a string: the first is the field
    if at <= 0:
        return None
    quoted = _MODELS.get(model)
    if quoted is None:
        if len(_MODELS) >= _MODELS_MAX:
            _MODELS.clear()  # client-chosen model names cannot grow it
        quoted = _MODELS[model] = _json(model)
    return (_CHAT_HEAD if chat else _HEAD) % (_json(id_), created, quoted, body[at:])


# The model's JSON per model name asked for (client text: escaped once per name, not per hit).
_MODELS: Final[dict[str, bytes]] = {}
_MODELS_MAX: Final = 1024


def events_of(entry: Entry) -> Entry:
    """`entry` with its `events` (a batch or a stream replays them): when it holds client bytes, a copy with
    them decoded (a stored entry is shared, never changed)."""
    if entry.body is not None and not entry.events:
        return msgspec.structs.replace(entry, events=[_rest(entry.body).choices])
    return entry


# What an entry holding a buffered answer's client bytes counts besides them: the memory its struct, times,
# names and usage take in the process (measured, rounded up: tests/cache/test_memory_held.py), which is more
# than they take encoded.
OVERHEAD: Final = 384


def size(entry: Entry) -> int:
    """What `entry` counts against `max_entry_bytes` and the memory store's `max_bytes`: its client bytes plus
    `OVERHEAD`, or the length of its encoding (`dump`) when it holds events."""
    body = entry.body
    return len(body) + OVERHEAD if body is not None else len(dump(entry))


encode_entry = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(Entry).decode


def dump(entry: Entry) -> bytes:
    return MAGIC + encode_entry(entry)


# Longer than any provider's name or target a config holds (a model asked for is at most 256 characters).
_NAME_CHARS: Final = 1024
# More tokens than any answer counts: a stored usage at or past it was not an upstream's.
_TOKENS: Final = 1 << 32


# How far ahead of this process's clock an entry's time may lie and the entry still serve: another replica's
# clock running ahead. An entry serves until `ttl_s` after its time by this process's clock (`fresh`), so at most
# this much longer than `ttl_s`; one stamped further ahead is not an entry (docs/cache.md).
CLOCK_SKEW_S: Final = 5.0


def fresh(entry: Entry, now: float, ttl_s: int, max_age: int | None = None) -> bool:
    """Whether `entry` may still serve at `now` (this process's wall clock) under a policy of `ttl_s`, to a request
    that accepts answers up to `max_age` old: whoever wrote it and with whatever expiry, never past `ttl_s` after
    its time as this process counts it."""
    age = now - entry.stored
    return age < ttl_s and (max_age is None or age <= max_age)


def read(raw: bytes | None, max_bytes: int, now: float, n: int = 1, chat: bool = False) -> Entry | str | None:
    """The entry in `raw` (from outside the process: checked whole, so that serving it cannot fail), None when
    absent or of another version, else what is wrong with it. Another process may have written any entry under
    any name: only one that answers this request (a chat answer to a chat request, a completion's to a
    completion, its `n` choices each finished), stamped no more than `CLOCK_SKEW_S` past `now` (this process's
    wall clock), is one."""
    if raw is None:
        return None
    if len(raw) > max_bytes:
        return "larger than max_entry_bytes"
    if not raw.startswith(MAGIC):
        return None if raw.startswith(b"gwc") else "not a cache entry"  # gwc<n>: another version's
    try:
        entry = _decode(memoryview(raw)[len(MAGIC) :])
        if entry.version != VERSION:
            return None
        if not math.isfinite(entry.stored):
            return "its time is not a number"
        if entry.stored - now > CLOCK_SKEW_S:
            # Fresh by its own time far longer than `ttl_s`: a clock far ahead, or a time no answer had.
            return f"stamped {entry.stored - now:.0f} s ahead of this replica's clock"
        if not all(0 < len(name) <= _NAME_CHARS and name.isprintable() for name in (entry.provider, entry.target)):
            return "its target is not a name"  # sent in header lines (`x-gateway-model`)
        usage = entry.usage
        if usage is not None and not (
            0 <= usage.prompt_tokens < _TOKENS
            and 0 <= usage.completion_tokens < _TOKENS
            and 0 <= usage.total_tokens < _TOKENS
        ):
            return "its usage is not a count of tokens"  # it is booked and summed: a count no answer has
        body = entry.body
        if body is None:
            # The gateway stores a chat answer only as its client bytes (gateway/cache/chat.py).
            if chat or not whole([ch for event in entry.events for ch in event], n):
                return "its answer is not one"
        else:
            # A buffered hit sends it from its first `,"choices":` on (`client_body`), a chat stream is made from
            # it whole (chat.py `replay`): each is decoded as it would be served, every field of it.
            served = client_body(body, "", 0, "", chat)
            if served is None or body.startswith(_CHAT) is not chat:
                return "its answer is not one"
            if chat:
                _as_chat(body)
            if not whole((_as_chat if chat else _as_completion)(served).choices, n):
                return "its answer is not one"
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError, TypeError):
        return "undecodable"
    return entry


def whole(choices: list[Choice] | list[ChatChoice], n: int) -> bool:
    """Whether `choices` (an answer's, or a stream's events' together) are `n` choices numbered from 0, each
    with its finish reason: an answer that completed, to a request for `n`."""
    seen: set[int] = set()
    ended: set[int] = set()
    for ch in choices:
        seen.add(ch.index)
        if ch.finish_reason is not None:
            ended.add(ch.index)
    return len(seen) == n and seen == ended and seen == set(range(n))


def held(raw: bytes) -> Entry:
    """An entry the memory store holds encoded (`dump`, made by this process): as served."""
    return _decode(memoryview(raw)[len(MAGIC) :])


# `add_event(choices, buf, -1)`: one stream event's choices appended to `buf`, encoded as an entry holds them
# (see `dump_events`). The encoder's own method, not a function around it: it runs once per streamed event.
add_event: Final[Callable[[list[Choice], bytearray, int], None]] = msgspec.msgpack.Encoder().encode_into


def _array(count: int) -> bytes:
    """A MessagePack array's header."""
    if count < 16:
        return bytes((0x90 | count,))
    return (b"\xdc" + count.to_bytes(2, "big")) if count < 1 << 16 else (b"\xdd" + count.to_bytes(4, "big"))


def dump_events(head: Entry, events: bytes | bytearray, count: int) -> bytes:
    """`dump` of `head` holding the `count` events encoded one after another in `events` (`add_event`): the
    same bytes, made without decoding them."""
    first = encode_entry((head.version, head.stored, head.model, head.provider, head.target, head.usage))
    last = encode_entry((head.system_fingerprint, head.body))
    # `first` opens a 6-item array (0x96): the entry is 9 items, its events the 7th.
    return b"".join((MAGIC, b"\x99", memoryview(first)[1:], _array(count), events, memoryview(last)[1:]))


_events = msgspec.msgpack.Decoder(list[list[Choice]]).decode


def decode_events(events: bytes | bytearray, count: int) -> list[list[Choice]]:
    """The `count` events encoded one after another in `events` (`add_event`)."""
    return _events(_array(count) + events)


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
        sent = client_body(entry.body, ctx.id, ctx.created, ctx.model, ctx.chat)
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
    """The stored answer as the upstream streamed it: one chunk per stored event, the usage, [DONE]. On a route
    whose dialect puts the usage on the last chunk (`ctx.usage_last`), the last event carries it unasked."""
    events = events_of(entry).events
    on_last = ctx.usage_last and not want_usage
    for i, event in enumerate(events):
        usage = entry.usage if on_last and i == len(events) - 1 else None
        yield sse_event(encode(ctx.completion(event, usage, system_fingerprint=entry.system_fingerprint)))
    if want_usage and entry.usage is not None:
        yield sse_event(encode(ctx.completion([], entry.usage)))
    yield DONE


__all__ = [
    "CLOCK_SKEW_S",
    "MAGIC",
    "OVERHEAD",
    "VERSION",
    "Entry",
    "add_event",
    "answer",
    "buffered_body",
    "client_body",
    "decode_events",
    "dump",
    "dump_events",
    "events_of",
    "encode_entry",
    "finished",
    "fresh",
    "held",
    "merged",
    "read",
    "replay_stream",
    "size",
    "whole",
]
