"""A list of prompts, cached per prompt: the answer split into one entry per prompt, and put back together.

lm-eval sends a batch of prompts in one request; a rerun of a partly different batch must pay only for
the prompts it has not seen. Choices of prompt i are numbered `i × n + j` (j < n) in a batched answer;
an entry holds one prompt's choices numbered j, and assembling gives them back their batch numbers.

A batched answer reports one usage for all its prompts. Each prompt's entry stores a share of it: prompt
tokens in proportion to the prompt's length, completion tokens to the length of the prompt's choices'
text; shares are whole tokens and sum to the batch's own counts, so a rerun reports the same total.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

import msgspec

from gateway.cache.entry import VERSION, Entry, dump, dump_events, finished, held, merged
from gateway.cache.job import Storing
from gateway.cache.store import MemoryStore
from gateway.upstream.framing import sse_event
from providers.base import CallContext
from wire.schema import Choice, Completion, Usage, encode


def prompt_items(prompt: str | list[Any]) -> list[Any]:
    """The request's prompts, one item each (a text, or a list of token ids)."""
    if isinstance(prompt, str) or not prompt or isinstance(prompt[0], int):
        return [prompt]
    return list(prompt)


def reindexed(choices: Sequence[Choice], index: int) -> list[Choice]:
    return [msgspec.structs.replace(ch, index=index + ch.index) for ch in choices]


def split_events(events: list[list[Choice]], prompts: int, n: int) -> list[list[list[Choice]]]:
    """A batch's events as per-prompt events, each prompt's choices numbered from 0."""
    if prompts == 1:
        return [events]
    out: list[list[list[Choice]]] = [[] for _ in range(prompts)]
    for event in events:
        per: dict[int, list[Choice]] = {}
        for ch in event:
            i = ch.index // n
            if 0 <= i < prompts:
                per.setdefault(i, []).append(msgspec.structs.replace(ch, index=ch.index - i * n))
        for i, choices in per.items():
            out[i].append(choices)
    return out


def join_events(per_prompt: Sequence[list[list[Choice]]], n: int) -> list[list[Choice]]:
    """Per-prompt events as one answer's events, in prompt order, choices numbered `i × n + j`."""
    if len(per_prompt) == 1:
        return per_prompt[0]
    return [reindexed(event, i * n) for i, events in enumerate(per_prompt) for event in events]


def join_answer(per_prompt: Sequence[list[list[Choice]]], n: int) -> list[Choice]:
    """Per-prompt events as one buffered answer's choices, in prompt order."""
    return [ch for i, events in enumerate(per_prompt) for ch in reindexed(merged(events), i * n)]


def _shares(total: int, weights: list[int]) -> list[int]:
    whole = sum(weights)
    if whole <= 0:
        weights, whole = [1] * len(weights), len(weights)
    out = [total * w // whole for w in weights]
    out[-1] += total - sum(out)
    return out


def share_usage(usage: Usage | None, prompts: list[Any], per_prompt: list[list[list[Choice]]]) -> list[Usage | None]:
    """The batch's usage shared out per prompt (exact for one prompt; sums to the batch's counts)."""
    if usage is None:
        return [None] * len(prompts)
    if len(prompts) == 1:
        return [usage]
    p = _shares(usage.prompt_tokens, [len(x) for x in prompts])
    c = _shares(usage.completion_tokens, [sum(len(ch.text) for ev in evs for ch in ev) for evs in per_prompt])
    return [Usage(prompt_tokens=a, completion_tokens=b, total_tokens=a + b) for a, b in zip(p, c, strict=True)]


def sum_usage(usages: Sequence[Usage | None]) -> Usage | None:
    if any(u is None for u in usages):
        return None
    p = sum(u.prompt_tokens for u in usages if u is not None)
    c = sum(u.completion_tokens for u in usages if u is not None)
    t = sum(u.total_tokens for u in usages if u is not None)
    return Usage(prompt_tokens=p, completion_tokens=c, total_tokens=t)


def assembled(entries: list[Entry], n: int) -> Entry:
    """Per-prompt entries as one entry for the whole request."""
    if len(entries) == 1:
        return entries[0]
    first = entries[0]
    return Entry(
        version=VERSION,
        stored=min(e.stored for e in entries),
        model=first.model,
        provider=first.provider,
        target=first.target,
        usage=sum_usage([e.usage for e in entries]),
        events=join_events([e.events for e in entries], n),
        system_fingerprint=first.system_fingerprint,
    )


def completed(fresh: Completion, found: list[Entry | None], missing: list[int], n: int) -> None:
    """The upstream's answer for the missing prompts, with the stored ones put back in prompt order."""
    per_fresh = split_events([fresh.choices], len(missing), n)
    per: list[list[list[Choice]]] = []
    usages: list[Usage | None] = [fresh.usage]
    it = iter(per_fresh)
    for e in found:
        if e is None:
            per.append(next(it))
        else:
            per.append(e.events)
            usages.append(e.usage)
    fresh.choices = join_answer(per, n)
    fresh.usage = sum_usage(usages)


async def spliced(
    stream: AsyncIterator[bytes], found: list[Entry | None], missing: list[int], n: int, ctx: CallContext
) -> AsyncIterator[bytes]:
    """A partly stored batch's stream: the stored prompts' chunks, then the upstream's for the others,
    every choice numbered as in the whole request and the usage chunk summed."""
    stored = sum_usage([e.usage for e in found if e is not None])
    try:
        for i, e in enumerate(found):
            if e is not None:
                for event in e.events:
                    yield sse_event(encode(ctx.completion(reindexed(event, i * n))))
        async for data in stream:
            try:
                c = _chunk(data[6:-2]) if data.startswith(b"data: {") else None
            except (msgspec.DecodeError, msgspec.ValidationError):
                c = None  # an error event: relayed as it is
            if c is None:
                yield data
                continue
            for ch in c.choices:
                p, j = divmod(ch.index, n)
                ch.index = missing[p] * n + j
            if c.usage is not None and stored is not None:
                c.usage = sum_usage([c.usage, stored])
            yield sse_event(encode(c))
    finally:
        await stream.aclose()  # type: ignore[attr-defined]


_chunk = msgspec.json.Decoder(Completion).decode


def store_batch(
    lookup: Storing, events: list[list[Choice]], usage: Usage | None, prompts: list[int], served: tuple[str, str]
) -> list[tuple[bytes, bytes]]:
    """An answer for these prompts (by their place in the request), stored one entry per prompt: in
    memory here; what a remote store has yet to be sent is returned."""
    n = lookup.n
    per = split_events(events, len(prompts), n)
    usages = share_usage(usage, [lookup.prompts[i] for i in prompts], per)
    for evs in per:
        if not finished(evs, n):
            return []  # a choice without its finish reason: not an answer that completed normally
    fingerprint = lookup.answer.system_fingerprint if lookup.answer is not None else None
    cache = lookup.cache
    now, model = cache.clock(), lookup.rec.model
    entries = [
        Entry(VERSION, now, model, served[0], served[1], u, evs, fingerprint)
        for evs, u in zip(per, usages, strict=True)
    ]
    if lookup.leading and len(prompts) == len(lookup.keys):
        lookup.result = entries
        waiter = lookup.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(assembled(entries, n))
    pol = lookup.policy
    assert pol is not None
    memory: MemoryStore = cache.memory
    here = pol.store is memory  # in memory now; a remote store is sent what is returned
    remote: list[tuple[bytes, bytes]] = []
    stored = 0
    for i, entry in zip(prompts, entries, strict=True):
        raw = dump(entry)  # an entry of events counts as its encoding, in memory too (`entry.size`)
        if len(raw) <= pol.max_entry_bytes:
            if here:
                memory.keep(lookup.keys[i], lookup.tag, raw, len(raw))
            else:
                remote.append((lookup.keys[i], raw))
            stored += len(raw)
    cache.count_stored(lookup.rec, stored)
    return remote


def store_one(
    lookup: Storing, events: list[list[Choice]], usage: Usage | None, prompt: int, provider: str, target: str
) -> bytes | None:
    """`store_batch` for one prompt (every one-prompt request): no split, no share, no list of entries."""
    n = lookup.n
    if n == 1 and len(events) == 1 and len(events[0]) == 1:  # one choice in one event (buffered)
        if events[0][0].finish_reason is None:
            return None
    elif not finished(events, n):
        return None  # a choice without its finish reason: not an answer that completed normally
    entry = _head(lookup, usage, provider, target, events)
    return kept(lookup, dump(entry), entry, prompt)


def store_stream(
    lookup: Storing, events: bytearray, count: int, usage: Usage | None, prompt: int, provider: str, target: str
) -> bytes | None:
    """`store_one` for a stream of one prompt whose `count` events the relay's chunks were encoded into as they
    came (`entry.add_event`): its entry is made from them without decoding them (decoded only for a request
    that waits for it). The caller checked that every choice got its finish reason."""
    return kept(lookup, dump_events(_head(lookup, usage, provider, target, []), events, count), None, prompt)


def _head(lookup: Storing, usage: Usage | None, provider: str, target: str, events: list[list[Choice]]) -> Entry:
    answer = lookup.answer
    fingerprint = answer.system_fingerprint if answer is not None else None
    return Entry(VERSION, lookup.cache.clock(), lookup.rec.model, provider, target, usage, events, fingerprint)


def kept(lookup: Storing, raw: bytes, entry: Entry | None, prompt: int) -> bytes | None:
    """The entry `raw` (its `dump`; `entry` when made) handed to whoever waits for it, stored in memory when it
    fits, or returned for a remote store to be sent."""
    cache, pol = lookup.cache, lookup.policy
    assert pol is not None
    memory: MemoryStore = cache.memory
    here = pol.store is memory
    if lookup.leading and len(lookup.keys) == 1:
        waiter = lookup.waiter
        waits = waiter is not None and not waiter.done()
        if waits or not here:  # a remote store is written after an await: one may come to wait meanwhile
            entry = entry if entry is not None else held(raw)
            lookup.result = [entry]
            if waits:
                waiter.set_result(entry)  # type: ignore[union-attr]
    if len(raw) > pol.max_entry_bytes:  # an entry of events counts as its encoding, in memory too
        return None
    cache.count_stored(lookup.rec, len(raw))
    if here:
        memory.keep(lookup.keys[prompt], lookup.tag, raw, len(raw))
        return None
    return raw


__all__ = [
    "store_batch",
    "store_one",
    "store_stream",
    "assembled",
    "completed",
    "join_answer",
    "join_events",
    "prompt_items",
    "reindexed",
    "share_usage",
    "spliced",
    "split_events",
    "sum_usage",
]
