"""The cache's policy for one request: covered or not, looked up, coalesced, replayed or stored.

`Cache.lookup` runs once a request is decoded, authorized and routed, before its admission: a hit (or
an identical request in flight whose answer this one waits for) is admitted without token costs. The
pipeline then hands the request to `Lookup.serve`, which replays an entry or runs the upstream path and
stores its answer: a buffered answer at once, a stream through `Lookup.chunk` / `Lookup.finish`, which
the relay calls for each chunk and at a normal end (never for a stream that failed, was resumed on
another target or was cut by the client).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Final, Protocol, TypeVar

from gateway.admission import Admission, Ticket
from gateway.cache.entry import VERSION, Entry, answer, dump, finished, load
from gateway.cache.key import cache_key, model_tag
from gateway.cache.store import MemoryStore, RedisStore, Store
from gateway.config import CacheConfig, LoadedConfig
from gateway.framing import DONE, sse_event
from gateway.metrics import Metrics, Record
from gateway.state import SharedState
from providers.base import CallContext, prompt_form
from wire.errors import GatewayError
from wire.schema import Choice, Completion, CompletionRequest, Usage, encode

HIT: Final = "hit"
MISS: Final = "miss"
COALESCED: Final = "coalesced"
BYPASS: Final = "bypass"


class Policy:
    __slots__ = ("mode", "ttl_s", "max_entry_bytes", "shared", "store")

    def __init__(self, cfg: CacheConfig, store: Store) -> None:
        self.mode = cfg.mode
        self.ttl_s = cfg.ttl_s
        self.max_entry_bytes = cfg.max_entry_bytes
        self.shared = cfg.scope == "shared"
        self.store = store


class Controls:
    """The request's `Cache-Control` directives that the cache honours."""

    __slots__ = ("no_cache", "no_store", "only_if_cached", "max_age")

    def __init__(self, header: str | None) -> None:
        self.no_cache = self.no_store = self.only_if_cached = False
        self.max_age: int | None = None
        if not header:
            return
        for part in header.lower().split(","):
            name, _, value = part.strip().partition("=")
            if name == "no-cache":
                self.no_cache = True
            elif name == "no-store":
                self.no_store = True
            elif name == "only-if-cached":
                self.only_if_cached = True
            elif name == "max-age":
                try:
                    self.max_age = max(int(value.strip().strip('"')), 0)
                except ValueError:
                    raise GatewayError(
                        "Cache-Control max-age must be a whole number of seconds",
                        status=400,
                        type="invalid_request_error",
                        code="invalid_cache_control",
                        param="cache-control",
                    ) from None


def deterministic(req: CompletionRequest) -> bool:
    """Whether sampling cannot change the answer: temperature 0, a seed, or nothing generated."""
    return req.temperature == 0 or req.seed is not None or req.max_tokens == 0


def prompt_count(req: CompletionRequest) -> int:
    form = prompt_form(req.prompt)
    return len(req.prompt) if form in ("texts", "token_lists") else 1


class JobLike(Protocol):
    """What the cache reads of the pipeline's job (gateway/attempt.py `Job`)."""

    req: CompletionRequest
    ctx: CallContext
    ticket: Ticket | None


class Answer(Protocol):
    headers: dict[str, str]


R = TypeVar("R", bound=Answer)
J = TypeVar("J", bound=JobLike)
Make = Callable[..., R]


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
        on_evict = metrics.cache_evictions.inc if metrics is not None else None
        self.memory = MemoryStore(cfg.cache.max_bytes, on_evict=on_evict)
        self.redis = RedisStore(shared) if shared.configured else None
        self.total_timeout_s = cfg.timeouts.total_ms / 1000

        def policy(block: CacheConfig) -> Policy | None:
            if block.mode == "off":
                return None
            store: Store = self.redis if block.store == "redis" and self.redis is not None else self.memory
            return Policy(block, store)

        self.default = policy(cfg.cache)
        self.providers = {n: policy(p.cache) for n, p in loaded.providers.items() if p.cache is not None}
        self.aliases: dict[str, Policy | None] = {}
        for alias in cfg.models:
            if alias.cache is not None:
                self.aliases[alias.name] = policy(alias.cache)
            else:
                vendor = alias.targets[0].model.partition("/")[0]
                self.aliases[alias.name] = self.providers.get(vendor, self.default)
        self.inflight: dict[str, asyncio.Future[Entry | None]] = {}
        self.counts = {HIT: 0, MISS: 0, COALESCED: 0, BYPASS: 0}
        self.stores = {s.kind: s for s in (self.memory, self.redis) if s is not None}

    def policy(self, model: str) -> Policy | None:
        found = self.aliases.get(model, self)
        if found is not self:
            return found  # type: ignore[return-value]
        return self.providers.get(model.partition("/")[0], self.default)

    def count(self, state: str, rec: Record) -> None:
        self.counts[state] += 1
        if self.metrics is not None:
            label = rec.label
            if label is None:
                label = rec.label = self.metrics.labels.fold(rec.model)
            self.metrics.cache_requests.labels(state, label).inc()

    async def lookup(
        self, req: CompletionRequest, key: str | None, headers: Mapping[str, str], rec: Record
    ) -> Lookup | None:
        """None when no cache covers the request's model; else what the cache found for it."""
        pol = self.policy(req.model)
        if pol is None:
            return None
        cc = Controls(headers.get("cache-control"))
        if cc.no_store or (pol.mode == "deterministic" and not deterministic(req)):
            if cc.only_if_cached:
                raise _cache_miss()
            return Lookup(self, BYPASS, rec)
        scope = "*" if pol.shared else "key:" + (key or "")
        digest = cache_key(req, scope)
        tag = model_tag(req.model)
        if not cc.no_cache:
            entry = load(await pol.store.get(digest, tag), pol.max_entry_bytes)
            if entry is not None and (cc.max_age is None or self.clock() - entry.stored <= cc.max_age):
                return Lookup(self, HIT, rec, entry=entry)
            waiting = self.inflight.get(digest)
            if waiting is not None and not cc.only_if_cached:
                entry = await self._wait(waiting, req)
                if entry is not None:
                    return Lookup(self, COALESCED, rec, entry=entry)
        if cc.only_if_cached:
            raise _cache_miss()
        lookup = Lookup(self, BYPASS if cc.no_cache else MISS, rec, policy=pol, digest=digest, tag=tag)
        if digest not in self.inflight:
            lookup.leader = self.inflight[digest] = asyncio.get_running_loop().create_future()
        return lookup

    async def _wait(self, waiting: asyncio.Future[Entry | None], req: CompletionRequest) -> Entry | None:
        """The answer of the identical request in flight, within this request's own deadline."""
        t = req.inference_timeout
        deadline = float(t) if isinstance(t, (float, int)) else self.total_timeout_s
        try:
            return await asyncio.wait_for(asyncio.shield(waiting), deadline)
        except TimeoutError:
            raise GatewayError(
                "The identical request in flight, whose answer this one waited for, did not answer in time",
                status=504,
                code="timeout",
                type="timeout_error",
            ) from None

    async def clear(self, model: str | None) -> int:
        tag = model_tag(model) if model is not None else None
        return sum([await s.clear(tag) for s in self.stores.values()])

    def stats(self) -> dict[str, Any]:
        served = self.counts[HIT] + self.counts[COALESCED]
        looked = served + self.counts[MISS]
        entries, size = self.memory.size()
        return {
            **self.counts,
            "hit_rate": round(served / looked, 4) if looked else 0.0,
            "memory_entries": entries,
            "memory_bytes": size,
            "memory_max_bytes": self.memory.max_bytes,
            "evictions": self.memory.evictions,
        }


def _cache_miss() -> GatewayError:
    return GatewayError(
        "No cached answer for this request, and Cache-Control: only-if-cached forbids asking the upstream",
        status=504,
        code="cache_miss",
    )


class Lookup:
    """One request's dealings with the cache, from its lookup to its answer stored (or not)."""

    __slots__ = ("cache", "state", "rec", "entry", "policy", "digest", "tag", "leader", "events", "answer", "expected")

    def __init__(
        self,
        cache: Cache,
        state: str,
        rec: Record,
        *,
        entry: Entry | None = None,
        policy: Policy | None = None,
        digest: str = "",
        tag: str = "",
    ) -> None:
        self.cache = cache
        self.state = state
        self.rec = rec
        self.entry = entry
        self.policy = policy  # set when the answer may be stored
        self.digest = digest
        self.tag = tag
        self.leader: asyncio.Future[Entry | None] | None = None
        self.events: list[list[Choice]] | None = None  # a stream's chunks, as the relay sends them
        self.answer: Completion | None = None  # a buffered answer, as the pipeline encodes it
        self.expected = 1  # choices a stream must finish to be stored: prompts x n

    @property
    def served(self) -> bool:
        """Answered from the cache: no upstream call, no token cost."""
        return self.entry is not None

    async def serve(
        self,
        job: J,
        rec: Record,
        buffered: Callable[[J, Record], Awaitable[R]],
        streamed: Callable[[J, Record], Awaitable[R]],
        make: Make[R],
    ) -> R:
        self.cache.count(self.state, rec)
        if self.entry is not None:
            return self._replay(job, rec, make)
        if job.req.stream:
            self.events = [] if self.policy is not None else None
            self.expected = prompt_count(job.req) * (job.req.n or 1)
            try:
                result = await streamed(job, rec)
            except BaseException:
                self.abandon()
                raise
            result.headers["x-gateway-cache"] = self.state
            stream = getattr(result, "stream", None)
            if self.leader is not None and stream is not None:
                result.stream = self._released(stream)  # type: ignore[attr-defined]
            return result
        try:
            result = await buffered(job, rec)
            if self.policy is not None and self.answer is not None:
                await self._store([self.answer.choices], self.answer)
        finally:
            self.abandon()
        result.headers["x-gateway-cache"] = self.state
        return result

    def _replay(self, job: JobLike, rec: Record, make: Make[R]) -> R:
        entry = self.entry
        assert entry is not None
        self.cache.admission.settle(job.ticket, 0)
        rec.provider, rec.target, rec.attempts, rec.usage = entry.provider, entry.target, 0, entry.usage
        rec.cached = True
        headers = {
            "x-gateway-provider": entry.provider,
            "x-gateway-model": entry.target,
            "x-gateway-attempts": "0",
            "x-gateway-cache": self.state,
            "age": str(max(int(self.cache.clock() - entry.stored), 0)),
        }
        if job.ticket is not None:
            headers |= job.ticket.headers
        req, ctx = job.req, job.ctx
        if not req.stream:
            return make(headers, body=encode(answer(entry, ctx.completion([]))))
        want_usage = bool(req.stream_options and req.stream_options.include_usage)
        return make(headers, stream=_replay_stream(entry, ctx, want_usage))

    # -- the hooks the relay calls on a streamed miss ----------------------------------------------

    def chunk(self, c: Completion) -> None:
        if self.events is not None:
            self.events.append(c.choices)

    async def finish(self, usage: Usage | None, served: tuple[str, str]) -> None:
        """A stream that ended normally on the target it started on: its chunks become the entry."""
        events, self.events = self.events, None
        if events is not None and self.policy is not None and finished(events, self.expected):
            await self._store(events, None, usage=usage, served=served)
        self.abandon()

    async def _store(
        self,
        events: list[list[Choice]],
        value: Completion | None,
        *,
        usage: Usage | None = None,
        served: tuple[str, str] | None = None,
    ) -> None:
        pol, rec = self.policy, self.rec
        assert pol is not None
        if served is None:
            served = (rec.provider, rec.target)
        entry = Entry(
            version=VERSION,
            stored=self.cache.clock(),
            model=rec.model,
            provider=served[0],
            target=served[1],
            usage=value.usage if value is not None else usage,
            events=events,
            system_fingerprint=value.system_fingerprint if value is not None else None,
        )
        raw = dump(entry)
        if len(raw) > pol.max_entry_bytes:
            return
        if self.leader is not None and not self.leader.done():
            self.leader.set_result(entry)
        await pol.store.put(self.digest, self.tag, raw, pol.ttl_s)
        if self.cache.metrics is not None and rec.label is not None:
            self.cache.metrics.cache_stored_bytes.labels(rec.label).inc(len(raw))

    def abandon(self) -> None:
        """No answer to share (an error, a stream cut short): whoever waits on this request asks for itself."""
        leader = self.leader
        if leader is None:
            return
        self.leader = None
        if not leader.done():
            leader.set_result(None)
        if self.cache.inflight.get(self.digest) is leader:
            del self.cache.inflight[self.digest]

    async def _released(self, stream: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        try:
            async for chunk in stream:
                yield chunk
        finally:
            self.abandon()
            await stream.aclose()  # type: ignore[attr-defined]


async def _replay_stream(entry: Entry, ctx: CallContext, want_usage: bool) -> AsyncIterator[bytes]:
    """The stored answer as the upstream streamed it: one chunk per stored event, the usage, [DONE]."""
    for event in entry.events:
        yield sse_event(encode(ctx.completion(event, system_fingerprint=entry.system_fingerprint)))
    if want_usage and entry.usage is not None:
        yield sse_event(encode(ctx.completion([], entry.usage)))
    yield DONE


def build(
    loaded: LoadedConfig, shared: SharedState, admission: Admission, metrics: Metrics | None = None
) -> Cache | None:
    """The pipeline's cache, or None when every `cache` block is off (then the request path skips it)."""
    cfg = loaded.config
    blocks = [cfg.cache, *(p.cache for p in loaded.providers.values()), *(m.cache for m in cfg.models)]
    if all(b is None or b.mode == "off" for b in blocks):
        return None
    return Cache(loaded, shared, admission, metrics)


__all__ = ["BYPASS", "COALESCED", "HIT", "MISS", "Cache", "Controls", "Lookup", "build", "deterministic"]
