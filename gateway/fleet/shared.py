"""Drain flags shared through Redis, so a drain sent to one gateway process reaches them all.

With `redis.url` set, the admin routes write each replica's flag to one hash per provider
(`gw:{fleet}:drain:<provider>`, field: the replica's URL, value `1` or `0`), and every process reads the
hashes back once a second in the background: a flag stored there wins over the replica's `drain:` in the
config. Without Redis each process keeps its own flags; a flag set while Redis does not answer is kept
in the process (`Fleet.unshared`) and stored when Redis answers again, before the stored ones are read,
so the older stored flag cannot undo it. Each pull also marks the URLs this process lists
(`gw:{fleet}:drain-seen:<provider>`), and a flag whose URL no process has marked for
`routing.drain_forget_ms` is deleted: never while a gateway (on an older config, during a rollout) lists it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Final

import redis.asyncio as aioredis

from gateway.fleet.background import Background
from gateway.fleet.picker import Fleet
from gateway.state import Degraded, SharedState

log = logging.getLogger("gateway.fleet")

SYNC_S: Final = 1.0


# Marks the URLs this process lists, forgets the flags of URLs nobody marked for `routing.drain_forget_ms`,
# and answers the flags. A flag with no mark (stored by a gateway that marks none) is marked now, so it too is
# forgotten only once nobody lists it. Redis's clock, so that gateways' clocks may differ. Both keys outlive the
# last pull by a minute more than that: a pull late by a second (Redis slow, the loop busy) must find them.
_SYNC = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[1])
for i = 2, #ARGV do redis.call('ZADD', KEYS[2], now, ARGV[i]) end
for _, url in ipairs(redis.call('HKEYS', KEYS[1])) do
  if not redis.call('ZSCORE', KEYS[2], url) then redis.call('ZADD', KEYS[2], now, url) end
end
for _, url in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now - ttl)) do
  redis.call('HDEL', KEYS[1], url)
  redis.call('ZREM', KEYS[2], url)
end
redis.call('PEXPIRE', KEYS[1], ttl + 60000)
redis.call('PEXPIRE', KEYS[2], ttl + 60000)
return redis.call('HGETALL', KEYS[1])
"""


def drain_key(provider: str) -> str:
    return "gw:{fleet}:drain:" + provider


def seen_key(provider: str) -> str:
    """When each replica URL was last listed by a running gateway (a sorted set, Redis time in ms)."""
    return "gw:{fleet}:drain-seen:" + provider


async def publish(shared: SharedState, fleet: Fleet, index: int, draining: bool) -> bool:
    """Store one replica's flag for every process; False when there is no Redis to store it in."""
    key, url = drain_key(fleet.provider), fleet.urls[index]
    try:
        await shared.run(lambda r: r.hset(key, url, "1" if draining else "0"))
    except Degraded:
        if shared.configured:
            fleet.unshared[index] = draining  # stored by the next pull that reaches Redis
        return False
    fleet.unshared.pop(index, None)
    return True


async def pull(shared: SharedState, fleets: Mapping[str, Fleet]) -> None:
    """Store the flags this process set while Redis did not answer, then apply the stored flags to its
    fleets (replicas without one keep theirs)."""
    for name, fleet in fleets.items():
        key = drain_key(name)
        unshared = {fleet.urls[i]: "1" if d else "0" for i, d in fleet.unshared.items()}
        kept = dict(fleet.unshared)

        args = [fleet.routing.drain_forget_ms, *fleet.urls]

        async def read(
            r: aioredis.Redis,
            key: str = key,
            seen: str = seen_key(name),
            unshared: dict[str, str] = unshared,
            args: list[object] = args,
        ) -> dict[bytes | str, bytes | str]:
            if unshared:
                await r.hset(key, mapping=unshared)  # type: ignore[arg-type]
            flat = await r.eval(_SYNC, 2, key, seen, *args)  # type: ignore[arg-type]
            return dict(zip(flat[::2], flat[1::2], strict=True))

        try:
            stored = await shared.run(read)
        except Degraded:
            return
        for i, draining in kept.items():
            if fleet.unshared.get(i) is draining:  # not set again while this pull waited
                del fleet.unshared[i]
        if kept:
            log.info("stored the drain flags of %s set while Redis did not answer", fleet.provider)
        for i, url in enumerate(fleet.urls):
            if i in fleet.unshared:  # set while this pull waited, and not stored yet
                continue
            value = stored.get(url.encode(), stored.get(url))
            if value is not None:
                fleet.draining[i] = value in (b"1", "1")


class DrainSync(Background):
    """The background reader of the shared flags: one task per process, only with Redis and fleets."""

    def __init__(self, source: Callable[[], tuple[SharedState, Mapping[str, Fleet]]]) -> None:
        self._source = source
        super().__init__()

    def start(self) -> None:
        shared, fleets = self._source()
        if shared.configured and fleets:
            self._spawn(self._run(), "fleet-drain-sync")

    async def _run(self) -> None:
        while True:
            try:
                await pull(*self._source())
            except Exception:  # a bug must not end the sync: keep the flags this process has
                log.exception("reading the shared drain flags failed")
            await asyncio.sleep(SYNC_S)
