"""Drain flags shared through Redis, so a drain sent to one gateway process reaches them all.

With `redis.url` set, the admin routes write each replica's flag to one hash per provider
(`gw:{fleet}:drain:<provider>`, field: the replica's URL, value `1` or `0`), and every process reads the
hashes back once a second in the background: a flag stored there wins over the replica's `drain:` in the
config. Without Redis, or while it is unreachable, each process keeps its own flags.
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


def drain_key(provider: str) -> str:
    return "gw:{fleet}:drain:" + provider


async def publish(shared: SharedState, fleet: Fleet, index: int, draining: bool) -> bool:
    """Store one replica's flag for every process; False when there is no Redis to store it in."""
    key, url = drain_key(fleet.provider), fleet.urls[index]
    try:
        await shared.run(lambda r: r.hset(key, url, "1" if draining else "0"))
    except Degraded:
        return False
    return True


async def pull(shared: SharedState, fleets: Mapping[str, Fleet]) -> None:
    """Apply the stored flags to this process's fleets (replicas without one keep theirs)."""
    for name, fleet in fleets.items():
        key = drain_key(name)

        async def read(r: aioredis.Redis, key: str = key) -> dict[bytes | str, bytes | str]:
            found: dict[bytes | str, bytes | str] = await r.hgetall(key)
            return found

        try:
            stored = await shared.run(read)
        except Degraded:
            return
        for i, url in enumerate(fleet.urls):
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
