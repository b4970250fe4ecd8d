"""Fixtures for the usage suite: one real redis-server (free loopback port, never 6379) for the session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.ratelimit.support import RedisProc


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisProc]:
    server = RedisProc()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def rds(redis_server: RedisProc) -> RedisProc:
    """The session's redis-server, running and empty."""
    if redis_server.proc is None or redis_server.proc.poll() is not None:
        redis_server.start()
    with redis_server.client() as r:
        r.flushall()
    return redis_server
