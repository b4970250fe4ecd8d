"""Fixtures for the rate-limit suite: the limiter over the session's redis-server (`rds`, tests/conftest.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from gateway.limits.ratelimit import Limiter
from gateway.state import SharedState
from tests.helpers.redis import RedisServer


@pytest.fixture
async def limiter(rds: RedisServer) -> AsyncIterator[Limiter]:
    """The limiter over the real Redis; fail closed, so a Redis problem fails the test instead of going local."""
    shared = SharedState(rds.url)
    made = Limiter(shared, fail_open=False)
    try:
        yield made
    finally:
        await made.close()
        await shared.close()
