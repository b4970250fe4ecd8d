"""The lease races of a Redis outage made deterministic with a loopback TCP relay in front of a real
`redis-server`: the relay can hold what the gateway writes (and deliver it later, as a stalled Redis or
a slow network would) or drop it (as a cut connection does). The limiter under test is the gateway's
own `Limiter`, talking to the relay over real sockets.

- An acquire that goes unanswered and reaches Redis only after its request ended (and after its
  cancel) must not leave a lease: the cancel's marker stops it.
- A release that is lost on the way must be made good once Redis answers again.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable

import pytest

from gateway.limits.ratelimit import Bucket, Limiter, RedisDown
from gateway.state import SharedState
from tests.helpers.redis import RedisServer
from tests.helpers.servers import free_port


class Relay:
    """127.0.0.1:port -> redis. Mode `pass` forwards; `hold` keeps the client's bytes (per connection)
    until `deliver`; `drop` discards them. Redis's answers always flow back."""

    def __init__(self, redis_port: int) -> None:
        self.redis_port = redis_port
        self.port = free_port()
        self.mode = "pass"
        self.held: list[tuple[asyncio.StreamWriter, bytearray]] = []
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: list[asyncio.StreamWriter] = []

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, upstream: bool) -> None:
        pending = bytearray()
        if upstream:
            self.held.append((writer, pending))
        try:
            while data := await reader.read(65536):
                if not upstream or self.mode == "pass":
                    writer.write(data)
                elif self.mode == "hold":
                    pending += data
        except (ConnectionError, OSError):
            pass
        # Keep the connection to Redis open after the client left while bytes are held, as the kernel
        # keeps a closed socket's unsent data: they still reach Redis when delivered.
        if not (upstream and pending):
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        r_reader, r_writer = await asyncio.open_connection("127.0.0.1", self.redis_port)
        self._writers += [writer, r_writer]
        for task in (self._pipe(reader, r_writer, True), self._pipe(r_reader, writer, False)):
            t = asyncio.ensure_future(task)
            self._tasks.add(t)
            t.add_done_callback(self._tasks.discard)

    async def deliver(self) -> None:
        """What was held reaches Redis now, and those connections close."""
        for writer, pending in self.held:
            if pending:
                writer.write(bytes(pending))
                pending.clear()
                await writer.drain()
                writer.close()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        # A pipe cancelled before it saw its peer close leaves its sockets open: close them all here.
        for w in self._writers:
            w.close()


@pytest.fixture
async def relay(rds: RedisServer) -> AsyncIterator[Relay]:
    made = Relay(rds.port)
    await made.start()
    try:
        yield made
    finally:
        await made.stop()


@pytest.fixture
async def limiter(relay: Relay) -> AsyncIterator[Limiter]:
    shared = SharedState(relay.url)
    made = Limiter(shared, fail_open=True)
    try:
        yield made
    finally:
        await made.close()
        await shared.close()


def slots(scope: str, limit: int = 2) -> Bucket:
    return Bucket(scope, "concurrent", limit)


def leases(rds: RedisServer, b: Bucket) -> dict[str, float]:
    with rds.client() as r:
        return {str(m): float(s) for m, s in r.zrange(b.redis_key, 0, -1, withscores=True)}


def no_live_lease(rds: RedisServer, b: Bucket) -> bool:
    """Cancel markers (negative scores) may remain; they never count as slots."""
    return all(score < 0 for score in leases(rds, b).values())


async def eventually(check: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


async def test_an_acquire_reaching_redis_after_its_cancel_writes_nothing(
    limiter: Limiter, relay: Relay, rds: RedisServer
) -> None:
    b = slots("key:late")
    warm = await limiter.acquire([b], 0)  # the script is loaded, the channel open
    await limiter.release([b], warm.lease)
    assert leases(rds, b) == {}

    relay.mode = "hold"
    start = time.monotonic()
    late = await limiter.acquire([b], 0)
    assert late.allowed and time.monotonic() - start < 1.0, "admitted on local state after the deadline"
    relay.mode = "pass"
    await limiter.release([b], late.lease)  # the request ends while its acquire is still on the way
    # The cancel reaches Redis (on a new connection) once Redis counts as back, before the acquire does.
    with contextlib.suppress(AssertionError):
        await eventually(lambda: late.lease in leases(rds, b), timeout=3)
    await relay.deliver()  # now Redis runs the acquire it never saw
    await asyncio.sleep(0.3)
    assert no_live_lease(rds, b), leases(rds, b)
    assert leases(rds, b)[late.lease] < 0, "the late acquire met the cancel's marker and left it as it was"
    # Both slots are free through Redis.
    d1, d2, d3 = [await limiter.acquire([b], 0) for _ in range(3)]
    assert [d1.allowed, d2.allowed, d3.allowed] == [True, True, False]
    for d in (d1, d2):
        await limiter.release([b], d.lease)


async def test_a_lost_release_is_made_good_when_redis_answers(limiter: Limiter, relay: Relay, rds: RedisServer) -> None:
    b = slots("key:lost")
    held = await limiter.acquire([b], 0)
    assert held.allowed and set(leases(rds, b)) == {held.lease}
    relay.mode = "drop"
    await limiter.release([b], held.lease)  # never reaches Redis
    assert set(leases(rds, b)) == {held.lease}
    relay.mode = "pass"
    await eventually(lambda: no_live_lease(rds, b))
    d1, d2 = [await limiter.acquire([b], 0) for _ in range(2)]
    assert d1.allowed and d2.allowed


async def test_a_refused_acquire_that_reaches_redis_late_is_cancelled(relay: Relay, rds: RedisServer) -> None:
    """fail_closed: the request is refused (RedisDown), yet its acquire may still be granted later."""
    shared = SharedState(relay.url)
    limiter = Limiter(shared, fail_open=False)
    try:
        b = slots("key:closed", 1)
        await limiter.release([b], (await limiter.acquire([b], 0)).lease)
        relay.mode = "hold"
        with pytest.raises(RedisDown):
            await limiter.acquire([b], 0)
        await relay.deliver()  # Redis grants it: a lease for a request that was refused
        relay.mode = "pass"
        await asyncio.sleep(0.3)
        await eventually(lambda: no_live_lease(rds, b))
        assert (await limiter.acquire([b], 0)).allowed
    finally:
        with contextlib.suppress(Exception):
            await limiter.close()
        await shared.close()
