"""Fixtures every suite may ask for: real redis-servers and PostgreSQL, a loopback upstream, a faulty one.

Each starts only when a test asks for it and stops by itself. The helpers they are built from live in
tests/helpers/ (docs/testing.md); a suite's own gateway and upstream fixtures live in its conftest.py.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

from tests.helpers.faults import FaultServer
from tests.helpers.postgres import PostgresServer
from tests.helpers.redis import RedisServer
from tests.helpers.upstreams import Upstream


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One redis-server for the session; tests take it through `rds`."""
    with RedisServer() as server:
        yield server


@pytest.fixture
def rds(redis_server: RedisServer) -> RedisServer:
    """The session's redis-server, empty (and running: a test may have restarted it)."""
    if not redis_server.running:
        redis_server.start()
    with redis_server.client() as r:
        r.flushall()
        r.script_flush()
    return redis_server


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    with PostgresServer() as server:
        yield server


@pytest.fixture
def pg(postgres_server: PostgresServer) -> PostgresServer:
    """The session's PostgreSQL server, running, with a fresh empty database for this test."""
    if not postgres_server.running:
        postgres_server.start()
    postgres_server.fresh_database()
    return postgres_server


@pytest.fixture
def redis() -> Iterator[RedisServer]:
    """A redis-server of the test's own, for tests that freeze, kill or restart it."""
    with RedisServer() as server:
        yield server
        if server.running:
            os.kill(server.proc.pid, signal.SIGCONT)  # in case the test left it frozen


@pytest.fixture(scope="module")
def upstream_server() -> Iterator[Upstream]:
    """One loopback upstream per module (tests/e2e overrides it with one per session)."""
    with Upstream() as server:
        yield server


@pytest.fixture
def upstream(upstream_server: Upstream) -> Iterator[Upstream]:
    """The upstream with no handler and nothing received, before and after the test."""
    upstream_server.reset()
    yield upstream_server
    upstream_server.reset()


@pytest.fixture
def faults() -> Iterator[FaultServer]:
    """A fresh fault-injecting upstream (tests/helpers/faults.py), stopped after the test."""
    with FaultServer() as server:
        yield server
