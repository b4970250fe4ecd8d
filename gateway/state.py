"""Shared state across replicas: one Redis connection pool, and what happens when Redis is away.

Every Redis-backed feature goes through `SharedState.run`, which gives each call a short deadline and,
on failure, reports "degraded" so the caller falls back to its in-process state. While degraded, Redis
is retried at most once a second (so a dead Redis costs no latency), and the warning is logged at most
once a minute. `/ready` reports the degradation.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Final, TypeVar

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

log = logging.getLogger("gateway.state")

T = TypeVar("T")
_WARN_EVERY_S: Final = 60.0
_RETRY_EVERY_S: Final = 1.0
_SOCKET_TIMEOUT_S: Final = 0.25


class Degraded(Exception):
    """Redis is not configured or not reachable right now: use local state."""


class SharedState:
    def __init__(self, url: str, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.url = url
        self.client: aioredis.Redis | None = (
            aioredis.Redis.from_url(
                url,
                socket_timeout=_SOCKET_TIMEOUT_S,
                socket_connect_timeout=_SOCKET_TIMEOUT_S,
                health_check_interval=0,
                retry_on_timeout=False,
                # A pooled connection Redis dropped (it restarted) is replaced on its next use instead of
                # failing the call, which would mean a degraded second per stale connection. One immediate
                # retry, on a dropped connection only: never on a timeout (the script may have run).
                retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
            )
            if url
            else None
        )
        self._clock = clock
        self._down_until = 0.0
        self._last_warning = -_WARN_EVERY_S
        self.failures = 0

    @property
    def configured(self) -> bool:
        return self.client is not None

    @property
    def degraded(self) -> bool:
        return self.client is not None and self._clock() < self._down_until

    async def run(self, op: Callable[[aioredis.Redis], Awaitable[T]]) -> T:
        """Run one Redis operation, or raise Degraded at once when Redis is absent or failing."""
        client = self.client
        if client is None or self._clock() < self._down_until:
            raise Degraded
        try:
            return await asyncio.wait_for(op(client), timeout=_SOCKET_TIMEOUT_S * 2)
        except (RedisError, OSError, TimeoutError) as exc:
            self.mark_down(exc)
            raise Degraded from None

    def mark_down(self, exc: BaseException) -> None:
        now = self._clock()
        self.failures += 1
        self._down_until = now + _RETRY_EVERY_S
        if now - self._last_warning >= _WARN_EVERY_S:
            self._last_warning = now
            log.warning("redis unreachable (%s): using in-process state until it answers", type(exc).__name__)

    async def ping(self) -> bool:
        if self.client is None:
            return False
        try:
            await self.run(lambda r: r.ping())
        except Degraded:
            return False
        self._down_until = 0.0
        return True

    async def close(self) -> None:
        if self.client is not None:
            await self.client.aclose()
