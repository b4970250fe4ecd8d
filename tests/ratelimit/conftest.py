"""Fixtures for the rate-limit suite: one real redis-server for the session, flushed before each test."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from gateway.ratelimit import Limiter
from gateway.state import SharedState

from .support import RedisProc


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisProc]:
    server = RedisProc()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def rds(redis_server: RedisProc) -> RedisProc:
    """The session's redis-server, empty (and running: a test may have restarted it)."""
    if redis_server.proc is None or redis_server.proc.poll() is not None:
        redis_server.start()
    with redis_server.client() as r:
        r.flushall()
        r.script_flush()
    return redis_server


@pytest.fixture
async def limiter(rds: RedisProc) -> AsyncIterator[Limiter]:
    """The limiter over the real Redis; fail closed, so a Redis problem fails the test instead of going local."""
    shared = SharedState(rds.url)
    made = Limiter(shared, fail_open=False)
    try:
        yield made
    finally:
        await made.close()
        await shared.close()
