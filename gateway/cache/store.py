"""Where entries live: a per-process LRU bounded in bytes, or the configured Redis shared by replicas.

Both tag entries with a digest of the model name (so one model's entries can be deleted). The memory
store holds a buffered answer's entry as it is (shared, never changed) and an entry of events encoded,
keyed by the request's canonical bytes (key.py); its bound counts what each holds (`SLOT`). Redis holds
them encoded, versioned, under a name that carries no client text, only the tag and the key's SHA-256; a
value that is not an entry is a miss, counted and logged. A Redis that cannot be reached makes every read
a miss and every write a no-op: the cache never fails a request.
"""

from __future__ import annotations

import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Final, Protocol

import msgspec
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from gateway.cache.entry import Entry, held, read
from gateway.cache.key import digest
from gateway.state import Degraded, SharedState

PREFIX: Final = "gwcache:"
# What the memory store spends on each entry besides its counted size and its key's bytes: the key's and
# value's object headers, the expiry, the count and the LRU's own node (measured, rounded up:
# tests/cache/test_memory_held.py).
SLOT: Final = 288

log = logging.getLogger("gateway.cache")

# What a value that is not a string reads as: no entry begins with it, so it is counted as not one. Every value
# is read through GETRANGE, at most one byte past `max_entry_bytes`: a planted value larger than any entry
# costs no more to read than the largest entry.
_NOT_A_STRING: Final = b"\x00"


class Kept(msgspec.Struct, gc=False):  # holds no container, so no cycle
    """What the memory store keeps per key: the entry (or its `dump`), when it was stored, its model tag, and what
    it counts in `bytes`. Not a tuple: a tuple is allocated tracked by the collector, so every stored entry
    counted toward the next young collection (one every few thousand misses, walking every request in
    flight); this struct is never tracked."""

    entry: Entry | bytes
    stored: float  # on the store's clock: it expires `ttl_s` after, by the `ttl_s` in force when it is read
    tag: str
    cost: int


class Store(Protocol):
    kind: str

    async def get_many(
        self, keys: list[bytes], tag: str, max_bytes: int, n: int = 1, chat: bool = False
    ) -> list[Entry | None]: ...

    async def clear(self, tag: str | None) -> int: ...

    def size(self) -> tuple[int, int]: ...


class MemoryStore:
    """An LRU of entries whose counted sizes (`entry.size`, plus the key and `SLOT`) never sum past `max_bytes`.

    An entry holding a buffered answer's client bytes is kept as it is; one holding events (a stream's chunks,
    a batch's prompt) is kept encoded (`dump`) and decoded when served: as objects its events would take
    several times the bytes they count."""

    kind = "memory"

    def __init__(
        self,
        max_bytes: int,
        *,
        clock: Callable[[], float] = time.monotonic,
        on_evict: Callable[[int], None] | None = None,
    ) -> None:
        self.max_bytes = max_bytes
        self.clock = clock
        self.on_evict = on_evict
        self.entries: OrderedDict[bytes, Kept] = OrderedDict()
        self.bytes = 0
        self.evictions = 0

    def _drop(self, key: bytes) -> None:
        self.bytes -= self.entries.pop(key).cost

    def fetch(self, key: bytes, ttl_s: float) -> Entry | None:
        """The entry stored under `key` less than `ttl_s` ago (shared: the caller never changes it). The policy's
        `ttl_s` as it is now, not as it was when stored: a reload that shortens it holds at once."""
        found = self.entries.get(key)
        if found is None:
            return None
        if self.clock() - found.stored >= ttl_s:
            self._drop(key)
            return None
        self.entries.move_to_end(key)
        value = found.entry
        return value if type(value) is Entry else held(value)  # type: ignore[arg-type]

    async def get_many(
        self, keys: list[bytes], tag: str, max_bytes: int, n: int = 1, chat: bool = False
    ) -> list[Entry | None]:
        # Stored by this process, within `max_entry_bytes` already; the reader checks each against its `ttl_s`.
        return [self.fetch(k, math.inf) for k in keys]

    def keep(self, key: bytes, tag: str, entry: Entry | bytes, size: int) -> None:
        """`entry` (or its `dump`) stored under `key`, counted as `size` (`entry.size`), the key's length and
        `SLOT`."""
        cost = size + len(key) + SLOT
        if cost > self.max_bytes:
            return
        entries = self.entries
        if key in entries:
            self.bytes -= entries.pop(key).cost
        if self.bytes + cost > self.max_bytes:
            self.evict(cost)  # a full store's every miss: no call per entry evicted
        entries[key] = Kept(entry, self.clock(), tag, cost)
        self.bytes += cost

    def evict(self, room: int) -> None:
        """Least recently used entries out until `room` more bytes fit."""
        entries, limit, counted = self.entries, self.max_bytes - room, self.bytes
        evicted = 0
        while counted > limit and entries:
            counted -= entries.popitem(last=False)[1].cost
            evicted += 1
        self.bytes = counted
        if evicted:
            self.evictions += evicted
            if self.on_evict is not None:
                self.on_evict(evicted)

    def adopt(self, previous: MemoryStore) -> None:
        """Take over `previous`'s entries (a config reload), within this store's own bound."""
        self.entries, self.bytes, self.evictions = previous.entries, previous.bytes, previous.evictions
        self.evict(0)

    async def clear(self, tag: str | None) -> int:
        doomed = [k for k, kept in self.entries.items() if tag is None or kept.tag == tag]
        for k in doomed:
            self._drop(k)
        return len(doomed)

    def size(self) -> tuple[int, int]:
        return len(self.entries), self.bytes


class RedisStore:
    """Entries in the configured Redis under `gwcache:<model digest>:<key's SHA-256>`, with Redis's own expiry."""

    kind = "redis"

    def __init__(
        self, shared: SharedState, on_corrupt: Callable[[], None] | None = None, clock: Callable[[], float] = time.time
    ) -> None:
        self.shared = shared
        self.clock = clock  # the wall clock an entry's time is read against (`entry.read`)
        self.corrupt = 0  # values read that were not entries: each a miss, counted and logged once
        self.refused = 0  # writes the Redis refused (logged once): the answer was not stored
        self.on_corrupt = on_corrupt

    async def _get(self, key: bytes, tag: str, max_bytes: int) -> bytes | None:
        name = f"{PREFIX}{tag}:{digest(key)}"

        async def get(r: aioredis.Redis) -> Any:
            try:
                return await r.getrange(name, 0, max_bytes)
            except ResponseError:
                return _NOT_A_STRING  # WRONGTYPE: that value's fault, not Redis's (`_entry` counts it)

        try:
            value = await self.shared.run(get)
        except Degraded:
            return None
        return value if isinstance(value, bytes) and value else None  # an absent key reads as no bytes

    def _entry(self, raw: Any, max_bytes: int, n: int, chat: bool) -> Entry | None:
        """`raw` (a value read) as an entry answering a request for `n` choices (of chat, or not), or a miss; a
        value that is not one is counted and logged."""
        found = read(raw, max_bytes, self.clock(), n, chat) if isinstance(raw, bytes) else None
        if found is None or type(found) is Entry:
            return found
        self.corrupt += 1
        if self.on_corrupt is not None:
            self.on_corrupt()
        log.warning("cache: a Redis value read as an entry was %s; served as a miss (it is overwritten)", found)
        return None

    async def get_many(
        self, keys: list[bytes], tag: str, max_bytes: int, n: int = 1, chat: bool = False
    ) -> list[Entry | None]:
        """The entries stored under `keys`: None for each absent, larger than `max_bytes`, not this version's
        entry, or not an answer to a request for `n` choices (of chat, or not)."""
        if len(keys) == 1:
            return [self._entry(await self._get(keys[0], tag, max_bytes), max_bytes, n, chat)]
        names = [f"{PREFIX}{tag}:{digest(k)}" for k in keys]

        async def many(r: aioredis.Redis) -> list[Any]:
            pipe = r.pipeline(transaction=False)
            for name in names:
                pipe.getrange(name, 0, max_bytes)
            found = await pipe.execute(raise_on_error=False)
            return [_NOT_A_STRING if isinstance(v, ResponseError) else (v or None) for v in found]

        values: list[Any]
        try:
            # One round trip; on a Cluster the keys may sit in different slots, so one read each there.
            if self.shared.cluster:
                values = [await self._get(k, tag, max_bytes) for k in keys]
            else:
                values = await self.shared.run(many)
        except Degraded:
            return [None] * len(keys)
        return [self._entry(v, max_bytes, n, chat) for v in values]

    async def put(self, key: bytes, tag: str, value: bytes, ttl_s: int) -> None:
        """`value` (an entry's `dump`) stored under `key` for `ttl_s`."""
        name = f"{PREFIX}{tag}:{digest(key)}"

        async def put(r: aioredis.Redis) -> None:
            try:
                await r.set(name, value, ex=ttl_s)
            except ResponseError as exc:
                # A write the Redis refused (OOM under `maxmemory` with `noeviction`): it still answers, and the
                # shared limits and the entries it holds stay in use; only this answer goes unstored.
                if not self.refused:
                    log.warning("cache: Redis refused to store an entry (%s); answers go unstored meanwhile", exc)
                self.refused += 1

        try:
            await self.shared.run(put)
        except Degraded:
            pass

    async def clear(self, tag: str | None) -> int:
        match = f"{PREFIX}{tag}:*" if tag is not None else f"{PREFIX}*"

        async def sweep(r: aioredis.Redis) -> int:
            gone = 0
            batch: list[bytes] = []
            async for name in r.scan_iter(match=match, count=500):
                batch.append(name)
                if len(batch) >= 500:
                    gone += int(await r.delete(*batch))
                    batch.clear()
            if batch:
                gone += int(await r.delete(*batch))
            return gone

        try:
            return await self.shared.run(sweep)
        except Degraded:
            return 0

    def size(self) -> tuple[int, int]:
        return -1, -1  # not counted per replica: Redis's own INFO says what it holds


__all__ = ["PREFIX", "SLOT", "Kept", "MemoryStore", "RedisStore", "Store"]
