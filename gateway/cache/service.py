"""The cache's policy for one request: covered or not, looked up, coalesced, replayed or stored.

`Cache.lookup` runs once a request is decoded, authorized and routed, before its admission: a hit is
admitted without token costs; a request identical to one in flight is admitted as the request it may yet
have to make, then waits for that one's answer (`Cache.coalesce`), its tokens given back if it gets it. The
pipeline then hands the request to `Lookup.serve`, which replays an entry or runs the upstream path and
stores its answer: a buffered answer at once, a stream through `Lookup.chunk` / `Lookup.finish` (called
by the relay at a normal end only). A buffered miss of one prompt in memory (`direct`) skips `serve`:
the pipeline calls `Lookup.done` with the answer it has just encoded for the client.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping
from functools import partial
from typing import Any, Final, cast

import msgspec
from msgspec.structs import replace

from gateway.cache.batch import assembled, completed, prompt_items, spliced, store_batch, store_one, store_stream
from gateway.cache.chat import Assembly, store_answer
from gateway.cache.counts import Series, stats
from gateway.cache.entry import (
    OVERHEAD,
    VERSION,
    Entry,
    add_event,
    decode_events,
    events_of,
    finished,
    fresh,
)
from gateway.cache.hit import replayed
from gateway.cache.inflight import coalesced, deadline_of
from gateway.cache.job import J, JobLike, Make, R
from gateway.cache.key import BATCH_KEYS_BYTES, cache_key, canonical, model_tag, packed
from gateway.cache.policy import (
    BYPASS,
    COALESCED,
    HIT,
    MISS,
    NO_CONTROLS,
    Controls,
    Policies,
    Policy,
    cache_miss,
    deterministic,
)
from gateway.cache.store import MemoryStore, RedisStore
from gateway.config import LoadedConfig
from gateway.limits.admission import Admission
from gateway.ops.metrics import Metrics, Record
from gateway.state import SharedState
from gateway.upstream.plan import Plan
from wire.chat import ChatRequest
from wire.schema import Completion, CompletionRequest, Usage, encode

_NO_ITEMS: Final = cast(list[Any], ())


class Cache:
    """Built once per pipeline when some `cache` block is on: the stores, the policies, the requests in flight."""

    def __init__(
        self,
        loaded: LoadedConfig,
        shared: SharedState,
        admission: Admission,
        metrics: Metrics | None = None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        cfg = loaded.config
        self.admission = admission
        self.metrics = metrics
        self.clock = clock
        on_evict = partial(metrics.tally.add, metrics.cache_evictions) if metrics is not None else None
        # On the cache's clock (`Lookup.done`); evictions counted by the tally (a full store evicts on every miss).
        self.memory = MemoryStore(cfg.cache.max_bytes, clock=clock, on_evict=on_evict)
        on_corrupt = metrics.cache_redis_not_entries.inc if metrics is not None else None
        self.redis = RedisStore(shared, on_corrupt, clock) if shared.configured else None
        self.policies = Policies(loaded, self.memory, self.redis)
        self._policies, self._scopes = self.policies.known, self.policies.scopes  # probed on every request
        self.inflight: dict[bytes, Lookup] = {}  # per key: the request in flight that will store its answer
        self.counts = {HIT: 0, MISS: 0, COALESCED: 0, BYPASS: 0}
        self.series: dict[str, Series] = {}  # per model as routed, with metrics on: its counts not yet added
        self.stores = {s.kind: s for s in (self.memory, self.redis) if s is not None}

    def series_of(self, model: str) -> Series:
        """`model`'s series, folded once (`series` is probed first on the request path)."""
        metrics = self.metrics
        assert metrics is not None
        if len(self.series) >= 1024:
            self.series.clear()  # client-chosen model names cannot grow it (a pending one is still flushed)
        series = self.series[model] = Series(metrics.labels.fold(model), metrics, self.counts)
        return series

    def count_stored(self, rec: Record, size: int) -> None:
        """`size` bytes stored for `rec`'s model."""
        metrics = self.metrics
        if metrics is not None and size:
            series = self.series.get(rec.model) or self.series_of(rec.model)
            metrics.tally.add(series, 0.0)  # flushed with the others
            series.stored += size

    def lookup(
        self, req: CompletionRequest, key: str | None, headers: Mapping[str, str], rec: Record, plan: Plan
    ) -> Lookup | None | Coroutine[Any, Any, Lookup | None]:
        """None when no cache covers the request's model; else what the cache found for it: as is when found in
        memory, or a coroutine to await when a Redis read must be waited for. A lookup with a request `ahead` (an
        identical one in flight) is to wait for its answer once admitted (`coalesce`), no longer than the request's
        own deadline: its `inference_timeout`, else its `plan`'s `total_ms`."""
        pol, tag, targets = self._policies.get(req.model) or self.policies.of(req.model)
        if pol is None:
            return None
        header = headers.get("cache-control")
        if (
            header is None
            and isinstance(req.prompt, str)
            and req.stream is None
            and req.stream_options is None
            and req.inference_timeout is None
            and (pol.plain or (pol.memory and deterministic(req)))
        ):
            # The common request (no directives, one text prompt, buffered, in memory): keyed and settled here.
            scope = pol.scope or self._scopes.get(key) or self.policies.scope(pol, key)
            try:  # `canonical`, inlined for a request with nothing beside its prompt: one call fewer per request
                digest = scope + (packed(req) if req.unrendered is None else canonical(req)) + targets
            except OverflowError:
                digest = scope + canonical(req) + targets
            memory = self.memory
            # `fetch` called only for a key stored: a miss costs one dict probe, not a call.
            if digest in memory.entries and (entry := memory.fetch(digest, pol.ttl_s)) is not None:  # a plain hit
                return Lookup(self, HIT, rec, None, digest, tag, entry=entry)
            if digest not in self.inflight:
                # Nothing stored, no identical request in flight: this one asks and stores (`Lookup.done`).
                lookup = self.inflight[digest] = Lookup(self, MISS, rec, pol, digest, tag, req.n or 1, True, True)
                return lookup
            cc = NO_CONTROLS
        else:
            cc = Controls(header) if header else NO_CONTROLS
            if cc.no_store or (pol.mode == "deterministic" and not deterministic(req)):
                if cc.only_if_cached:
                    raise cache_miss()
                return Lookup(self, BYPASS, rec)
            digest = b""
        prompt = req.prompt
        if digest or isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
            # One prompt, the common case: one key, one read (in memory, without a coroutine).
            digest = digest or cache_key(req, self.policies.scope(pol, key), targets)
            lookup = Lookup(self, MISS, rec, pol, digest, tag, 1, False, False, [digest], [prompt])
            if cc.no_cache:
                return self._decide(lookup, req, cc, [], plan)
            if pol.memory:
                entry = self.memory.fetch(digest, pol.ttl_s)
                if cc is NO_CONTROLS:
                    if entry is not None:  # the plain hit
                        return lookup.served_by(HIT, entry)
                    if digest not in self.inflight:
                        # The plain miss: nothing stored, no identical request in flight, no directives.
                        lookup.found, lookup.n, lookup.leading = [None], req.n or 1, True
                        lookup.direct = not req.stream  # a stream goes through `serve`
                        self.inflight[digest] = lookup
                        return lookup
                return self._decide(lookup, req, cc, [entry], plan)
        else:
            prompts = prompt_items(prompt)
            scope = self.policies.scope(pol, key)
            if len(prompts) > 1 and len(cache_key(replace(req, prompt=""), scope)) * len(prompts) > BATCH_KEYS_BYTES:
                # Its keys would repeat the rest of the request once per prompt past the bound: not cached.
                if cc.only_if_cached:
                    raise cache_miss()
                return Lookup(self, BYPASS, rec)
            # One entry per prompt: a one-item list shares its prompt's entry with the prompt sent alone.
            keys = [cache_key(replace(req, prompt=p), scope, targets) for p in prompts]
            # What identical requests in flight coalesce on: the whole request.
            digest = keys[0] if len(keys) == 1 else cache_key(req, scope, targets)
            lookup = Lookup(self, MISS, rec, pol, digest, tag, 1, False, False, keys, prompts)
            if cc.no_cache:
                return self._decide(lookup, req, cc, [], plan)
        return self._read(lookup, req, cc, plan)

    async def _read(self, lookup: Lookup, req: CompletionRequest, cc: Controls, plan: Plan) -> Lookup:
        chat = type(req) is ChatRequest
        pol = cast(Policy, lookup.policy)  # a lookup that reads has its policy
        # What is read must answer this request (its `n` choices, a chat's answer or a completion's): a value
        # another process wrote under this name may be anything.
        stored = await pol.store.get_many(lookup.keys, lookup.tag, pol.max_entry_bytes, req.n or 1, chat)
        return self._decide(lookup, req, cc, stored, plan)

    def _decide(
        self, lookup: Lookup, req: CompletionRequest, cc: Controls, stored: list[Entry | None], plan: Plan
    ) -> Lookup:
        """What the entries read say: a hit, a wait for the identical request in flight (`ahead`), or a miss."""
        n = lookup.n = req.n or 1
        found: list[Entry | None] = [None] * len(lookup.keys)
        lookup.found = found
        if not cc.no_cache:
            now, ttl_s, max_age = self.clock(), lookup.policy.ttl_s, cc.max_age  # type: ignore[union-attr]
            for i, entry in enumerate(stored):
                # Never past its policy's `ttl_s` by this process's clock, whatever expiry its writer gave it.
                if entry is not None and fresh(entry, now, ttl_s, max_age):
                    found[i] = entry if len(stored) == 1 else events_of(entry)  # a batch joins events
            if None not in found:
                return lookup.served_by(HIT, assembled(found, n))  # type: ignore[arg-type]
            ahead = self.inflight.get(lookup.digest)
            if ahead is not None and not cc.only_if_cached:
                # It waits for that one's answer (`coalesce`) once admitted, as the request it may yet have to make
                # is: a request waiting holds its key's `concurrent` slot, and is counted in its request rates. The
                # future it waits on is made now: the answer may come while it is admitted (a queue, a Redis trip).
                lookup.ahead, lookup.until = ahead, deadline_of(req, plan)
                if ahead.waiter is None:
                    ahead.waiter = asyncio.get_running_loop().create_future()
                return lookup
        return self._miss(lookup, req, cc)

    async def coalesce(self, lookup: Lookup, req: CompletionRequest) -> Lookup:
        """`lookup` (one with a request `ahead`, admitted) answered by the identical request in flight, or made a
        miss when it must ask the upstream itself; a 504 past its deadline."""
        ahead, lookup.ahead = lookup.ahead, None
        assert ahead is not None
        entry = await coalesced(self.inflight, ahead, lookup.digest, lookup.n, lookup.until)
        # Only a lookup without `no-cache` or `only-if-cached` waits: a miss with no directive to honour.
        return lookup.served_by(COALESCED, entry) if entry is not None else self._miss(lookup, req, NO_CONTROLS)

    def _miss(self, lookup: Lookup, req: CompletionRequest, cc: Controls) -> Lookup:
        if cc.only_if_cached:
            raise cache_miss()
        if cc.no_cache:
            lookup.state = BYPASS
        if lookup.digest not in self.inflight:
            self.inflight[lookup.digest] = lookup
            lookup.leading = True
        # `Pipeline.complete` calls `done` for a buffered one (a stream goes through `serve`).
        lookup.direct = len(lookup.keys) == 1 and lookup.policy.store is self.memory and not req.stream  # type: ignore[union-attr]
        return lookup

    def adopt(self, previous: Cache) -> None:
        """A config reload keeps what the memory store holds, and the counts (the previous cache's `Series`
        add theirs to the same dict)."""
        self.memory.adopt(previous.memory)
        self.counts = previous.counts

    async def clear(self, model: str | None) -> int:
        tag = model_tag(model) if model is not None else None
        return sum([await s.clear(tag) for s in self.stores.values()])

    def stats(self) -> dict[str, Any]:
        return stats(self)


class Lookup(msgspec.Struct):
    """One request's dealings with the cache, from its lookup to its answer stored (or not).

    A struct, not a class with an `__init__`: it is made on every covered request, and msgspec fills its
    fields without a Python call."""

    cache: Cache
    state: str
    rec: Record
    policy: Policy | None = None  # set when the answer may be stored
    digest: bytes = b""
    tag: str = ""
    n: int = 1
    leading: bool = False  # the request in flight that identical ones wait for
    direct: bool = False  # a buffered miss of one prompt stored in memory: no `serve` around the pipeline's call
    # Per prompt (none yet for a plain miss: `serve` makes them if it ever needs them). The default is an
    # empty tuple, not a list msgspec would copy for every request: these are replaced, never appended to.
    keys: list[bytes] = _NO_ITEMS
    prompts: list[Any] = _NO_ITEMS
    found: list[Entry | None] = _NO_ITEMS  # per prompt: the entry already stored
    entry: Entry | None = None  # what a hit (or a coalesced request) is answered with
    waiter: asyncio.Future[Entry | None] | None = None  # made by the first that waits
    ahead: Lookup | None = None  # the identical request in flight this one is to wait for, once admitted
    until: float = 0.0  # when (the loop's time) it stops waiting: its own deadline
    result: list[Entry] | None = None  # what it stored, for one that comes to wait after
    # A stream's chunks, encoded as the relay sends them (`entry.add_event`), while they can still be stored:
    # how many, which choices got their finish reason, and what they may come to before they cannot.
    buf: bytearray | None = None
    parts: int = 0
    ended: set[int] | None = None
    room: int = 0
    blocked: float = 0.0  # since then (the loop's time) its client has been taking a chunk, or it waits for a slot
    answer: Completion | None = None  # a buffered answer, as the pipeline encodes it
    assembly: Assembly | None = None  # a chat stream's chunks added up, while they can still be stored
    missing: list[int] = _NO_ITEMS  # the prompts (by their place in the request) the upstream is asked for

    def served_by(self, state: str, entry: Entry) -> Lookup:  # answered from the cache: nothing stored
        self.state, self.entry, self.policy = state, entry, None
        return self

    async def serve(
        self,
        job: J,
        rec: Record,
        buffered: Callable[[J, Record], Awaitable[R]],
        streamed: Callable[[J, Record], Awaitable[R]],
        make: Make[R],
    ) -> R:
        self.count(rec)
        if self.entry is not None:
            return self.replay(job, rec, make)
        found = self.found
        if not found:  # a plain miss (made without its per-prompt lists) served here after all
            found, self.keys, self.prompts = [None], [self.digest], [job.req.prompt]
            self.found = found
        missing = self.missing = [0] if len(found) == 1 else [i for i, e in enumerate(found) if e is None]
        partial = len(missing) < len(found)
        if partial:
            # Some prompts are stored: the upstream is asked only for the others.
            sub = [self.prompts[i] for i in missing]
            job.req = replace(job.req, prompt=sub)
            job.ctx.prompts = sub if isinstance(sub[0], str) else None
        if job.req.stream:
            pol = self.policy
            if pol is not None and job.ctx.chat:
                self.assembly = Assembly(pol.max_entry_bytes)  # a chat stream is stored as its answer
            elif pol is not None:
                # What the stream's entries could count at most: past it, nothing more is held for them.
                self.buf, self.ended, self.room = bytearray(), set(), pol.max_entry_bytes * len(missing)
            try:
                result = await streamed(job, rec)
            except BaseException:
                self.abandon()
                raise
            result.headers["x-gateway-cache"] = self.state
            stream = getattr(result, "stream", None)
            if partial and stream is not None:
                # The client takes the spliced stream, stored events first: its pace is timed there. An unspliced
                # stream's is timed by the relay, which lets go of whoever waits when it ends (`chunk`, `abandon`).
                spliced_ = spliced(stream, self.found, self.missing, self.n, job.ctx)
                result.stream = self._released(spliced_)  # type: ignore[attr-defined]
            return result
        try:
            result = await buffered(job, rec)
            fresh = self.answer
            if fresh is not None and self.policy is not None:
                if job.ctx.chat:
                    raw = store_answer(self, fresh, rec.provider, rec.target)  # type: ignore[arg-type]
                    remote = [(self.digest, raw)] if raw is not None else None
                elif len(missing) == 1:
                    raw = store_one(self, [fresh.choices], fresh.usage, missing[0], rec.provider, rec.target)
                    remote = [(self.keys[missing[0]], raw)] if raw is not None else None
                else:
                    remote = store_batch(self, [fresh.choices], fresh.usage, missing, (rec.provider, rec.target))
                if remote:
                    await self._send(remote)
            if fresh is not None and len(missing) < len(self.found):
                completed(fresh, self.found, missing, self.n)
                result.body = encode(fresh)  # type: ignore[attr-defined]
        finally:
            self.abandon()
        result.headers["x-gateway-cache"] = self.state
        return result

    def count(self, rec: Record) -> Series | None:
        """The lookup counted, by its state and model, once the request is admitted; the model's series (None
        without metrics), to which a miss adds the bytes it stored."""
        cache, state = self.cache, self.state
        rec.cache_outcome = state
        metrics = cache.metrics
        if metrics is None:
            cache.counts[state] += 1
            return None
        series = cache.series.get(rec.model) or cache.series_of(rec.model)
        rec.label = series.label  # for the metrics and the usage booking, which fold it otherwise
        lookups = series.lookups
        if not lookups:  # the model's first lookup since the tally's last flush: `Tally.add`, inlined
            pending = metrics.tally.pending
            if not pending:
                metrics.tally.arm()
            pending[series] = 0.0  # the tally flushes it (`Series.inc`)
        lookups[state] = lookups.get(state, 0) + 1
        return series

    def done(self, rec: Record, body: bytes) -> None:
        """A `direct` miss answered: counted, its answer (`body`, the client's JSON) stored in memory and handed
        to whoever waits, and the request released, in one step (nothing can come to wait in between)."""
        fresh, n = self.answer, self.n
        if fresh is None or not (
            (n == 1 and len(choices := fresh.choices) == 1 and choices[0].finish_reason is not None)
            or finished([fresh.choices], n)
        ):
            self.count(rec)
            self.abandon()  # no answer, or one without every finish reason: nothing stored
            return
        cache, pol = self.cache, self.policy  # a `direct` lookup always has its policy
        model = rec.model
        # Stored as it is (the client's bytes, cut when served): requests share it, and nothing changes it.
        usage, fp = fresh.usage, fresh.system_fingerprint
        entry = Entry(VERSION, cache.clock(), model, rec.provider, rec.target, usage, _NO_ITEMS, fp, body)
        counted = len(body) + OVERHEAD  # `entry.size`, inlined
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(entry)
        digest = self.digest
        if self.leading:
            # Its own: a leading request is the one `inflight` holds (and `abandon` after this finds it gone).
            del cache.inflight[digest]
        if counted <= pol.max_entry_bytes:  # type: ignore[union-attr]
            cache.memory.keep(digest, self.tag, entry, counted)
        else:
            counted = 0
        # `count`, inlined: every miss ends here, and a call of its own cost more than its body.
        rec.cache_outcome = state = self.state
        metrics = cache.metrics
        if metrics is None:
            cache.counts[state] += 1
            return
        series = cache.series.get(model) or cache.series_of(model)
        rec.label = series.label
        lookups = series.lookups
        if not lookups:
            pending = metrics.tally.pending
            if not pending:
                metrics.tally.arm()
            pending[series] = 0.0
        lookups[state] = lookups.get(state, 0) + 1
        series.stored += counted

    def replay(self, job: JobLike, rec: Record, make: Make[R]) -> R:
        assert self.entry is not None
        return replayed(self.entry, self.state, self.cache.clock(), self.cache.admission, job, rec, make)

    # -- the hooks the relay calls on a streamed miss ----------------------------------------------

    def chunk(self, c: Completion) -> None:
        buf = self.buf
        if buf is not None:
            choices = c.choices
            add_event(choices, buf, -1)
            self.parts += 1
            for ch in choices:
                if ch.finish_reason is not None:
                    self.ended.add(ch.index)  # type: ignore[union-attr]
            if len(buf) > self.room:
                # Too large to store: what was held is let go, and whoever waits for it asks for itself now.
                self.buf = None
                self.abandon()
        elif self.assembly is not None and not self.assembly.add(c):  # type: ignore[arg-type]  # a ChatChunk
            self.assembly = None
            self.abandon()

    async def finish(self, usage: Usage | None, served: tuple[str, str]) -> None:
        """A stream that ended normally on the target it started on: its chunks become the entries."""
        buf, self.buf = self.buf, None
        if buf is not None and self.policy is not None:
            missing = self.missing
            if len(missing) == 1:
                whole = len(self.ended or ()) >= self.n  # every choice got its finish reason
                raw = store_stream(self, buf, self.parts, usage, missing[0], *served) if whole else None
                remote = [(self.keys[missing[0]], raw)] if raw is not None else None
            else:
                remote = store_batch(self, decode_events(buf, self.parts), usage, missing, served)
            if remote:
                await self._send(remote)
        elif (assembly := self.assembly) is not None and self.policy is not None:
            self.assembly, answer = None, assembly.answer(usage, self.n)
            raw = store_answer(self, answer, *served) if answer is not None else None
            if raw is not None:
                await self._send([(self.digest, raw)])
        self.abandon()

    async def _send(self, remote: list[tuple[bytes, bytes]]) -> None:
        pol = self.policy
        assert pol is not None
        store = pol.store
        assert isinstance(store, RedisStore)  # a memory store is written at once, never sent entries
        for key, raw in remote:
            await store.put(key, self.tag, raw, pol.ttl_s)

    def abandon(self) -> None:
        """No answer to share (an error, a stream cut short): whoever waits on this request asks for itself."""
        if not self.leading:
            return
        self.leading = False
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        inflight = self.cache.inflight
        if inflight.get(self.digest) is self:
            del inflight[self.digest]

    async def _released(self, stream: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        now = asyncio.get_running_loop().time
        try:
            async for chunk in stream:
                self.blocked = now()  # until the client has taken it (`inflight.wait_for` reads it)
                yield chunk
                self.blocked = 0.0
        finally:
            self.abandon()
            await stream.aclose()  # type: ignore[attr-defined]


__all__ = ["Cache", "Lookup"]
