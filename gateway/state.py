"""Shared state across replicas: the Redis client (one node, a Cluster or a Sentinel-managed master),
and what happens when Redis is away.

`redis.url` picks the deployment: `redis://`/`rediss://`/`unix://` one node, `redis+cluster://h:p,h:p`
a Redis Cluster, `redis+sentinel://h:p,h:p/service` the master a set of Sentinels names (docs/ratelimits.md).
Every option in the URL is either honoured by both Redis clients (redis-py's and the rate-limit channel,
which sets its connection up with redis-py's own connection class) or refused at start-up naming it.

Every Redis-backed feature goes through `SharedState.run`: each call has one short deadline (`Deadline`,
connecting, writing and reading within it) and, on failure, reports "degraded" so the caller falls back to
in-process state. While degraded, Redis is retried at most once a second (a dead Redis costs no latency)
and the warning is logged at most once a minute. `/ready` reports the degradation.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Final, Literal, TypeVar, cast
from urllib.parse import urlsplit

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import Connection, SSLConnection, UnixDomainSocketConnection, parse_url
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import NoBackoff
from redis.crc import key_slot
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from gateway.grace import Grace

log = logging.getLogger("gateway.state")

T = TypeVar("T")
_WARN_EVERY_S: Final = 60.0
_RETRY_EVERY_S: Final = 1.0
_SOCKET_TIMEOUT_S: Final = 0.25

Mode = Literal["node", "cluster", "sentinel"]
SCHEMES: Final = ("redis", "rediss", "unix", "redis+cluster", "rediss+cluster", "redis+sentinel", "rediss+sentinel")
# Options the gateway cannot honour: its code reads bytes and RESP2 reply shapes, and it owns the pool
# sizes and retries (one immediate retry on a dropped connection, never on a timeout: see `SharedState`).
_REFUSED: Final = {
    "decode_responses": "the gateway reads raw bytes",
    "protocol": "the gateway speaks RESP2",
    "legacy_responses": "the gateway reads redis-py's default reply shapes",
    "retry_on_timeout": "a script that timed out may have run: the gateway never retries it",
    "retry_on_error": "the gateway owns retries",
    "timeout": "it sizes a blocking pool's wait; the gateway's pools do not block (see socket_timeout)",
}
# Options that size redis-py's pool, not a connection (the channel has one connection of its own).
_POOL_OPTIONS: Final = frozenset({"max_connections"})


class Degraded(Exception):
    """Redis is not configured or not reachable right now: use local state."""


class Deadline:
    """`asyncio.timeout(delay)`, except that a block still waiting when the delay is up is given the loop's
    next read of its sockets, and what that read wakes, before it times out (gateway/grace.py says why).

    The verdict is passed on from the timer to before the next poll, to after it (`Grace`), and then, by
    `reschedule`, to after the callbacks that poll woke. A Redis that does not answer still fails the block
    a few passes late.
    """

    __slots__ = ("_delay", "_handle", "_timeout")

    def __init__(self, delay: float) -> None:
        self._delay = delay
        self._timeout = asyncio.timeout(None)
        self._handle: asyncio.Handle | Grace | None = None

    async def __aenter__(self) -> None:
        await self._timeout.__aenter__()
        self._handle = asyncio.get_running_loop().call_later(self._delay, self._due)

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._handle is not None:
            self._handle.cancel()
        await self._timeout.__aexit__(exc_type, exc, tb)

    def _due(self) -> None:
        self._handle = Grace(asyncio.get_running_loop(), self._expire)

    def _expire(self) -> None:
        self._handle = None
        self._timeout.reschedule(asyncio.get_running_loop().time())


@dataclass(frozen=True)
class RedisUrl:
    """`redis.url` taken apart: the deployment and the options of every data connection."""

    mode: Mode
    # Connection keyword arguments as redis-py parses them (host, port, db, credentials, ssl_*, socket_*).
    options: dict[str, Any]
    # Cluster: the start-up nodes; Sentinel: the sentinels. One node: empty.
    nodes: tuple[tuple[str, int], ...] = ()
    service: str = ""
    sentinel_options: dict[str, Any] = field(default_factory=dict)

    @property
    def tls(self) -> bool:
        return self.options.get("connection_class") is SSLConnection

    @property
    def timeout_s(self) -> float:
        """Each call's socket timeout: the URL's `socket_timeout`, else 0.25 s; a call's deadline is twice it."""
        return float(self.options.get("socket_timeout") or _SOCKET_TIMEOUT_S)

    def connection(self, host: str | None = None, port: int | None = None, **extra: Any) -> Connection:
        """A redis-py connection (not yet connected) with every option of the URL, to `host:port` if given."""
        kw = {k: v for k, v in self.options.items() if k not in _POOL_OPTIONS and k != "connection_class"}
        kw.update(extra)
        kw.setdefault("socket_timeout", _SOCKET_TIMEOUT_S)
        kw.setdefault("socket_connect_timeout", _SOCKET_TIMEOUT_S)
        cls = self.options.get("connection_class") or Connection
        if cls is UnixDomainSocketConnection:
            return cast(Connection, cls(**kw))
        kw.pop("path", None)
        if host is not None:
            kw["host"], kw["port"] = host, port
        if self.mode == "cluster":
            kw.pop("db", None)
        return cast(Connection, cls(**kw))

    def deadline_connection(self, host: str | None = None, port: int | None = None, **extra: Any) -> Connection:
        """`connection` for a caller whose `Deadline` bounds its every wait: no read timer of redis-py's (a reply
        read late is given its grace), and a connect timeout only where the URL sets one explicitly (as the
        shared client's pool honours it)."""
        connect_s = self.options.get("socket_connect_timeout")
        return self.connection(host, port, socket_timeout=None, socket_connect_timeout=connect_s, **extra)


class UrlError(ValueError):
    """`redis.url` cannot be honoured; the message names the option and never repeats a credential."""


def _endpoints(hosts: str, default_port: int) -> tuple[tuple[str, int], ...]:
    out = []
    for part in hosts.split(","):
        try:
            split = urlsplit("//" + part)
            host, port = split.hostname, split.port or default_port
        except ValueError:
            raise UrlError(f"bad host:port {part!r}") from None
        if not host:
            raise UrlError(f"bad host:port {part!r}")
        out.append((host, port))
    return tuple(out)


# A URL whose user or password holds a `/`, `?` or `#` as it is: the `@` that ends them then sits past the
# host, and a parser takes part of the password for the host, the port or the path, which its error repeats.
MISPLACED_CREDENTIAL: Final = (
    "its user or password holds an unencoded '/', '?' or '#': percent-encode them (%2F, %3F, %23)"
)


def credential_misplaced(url: str) -> bool:
    """Whether `url` has an `@` past its authority (see `MISPLACED_CREDENTIAL`)."""
    rest = url.partition("://")[2]
    cut = min([i for i in (rest.find("/"), rest.find("?"), rest.find("#")) if i >= 0], default=len(rest))
    return "@" in rest[cut:]


def parse_redis_url(url: str) -> RedisUrl:
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in SCHEMES:
        raise UrlError("must start with one of " + ", ".join(s + "://" for s in SCHEMES))
    if credential_misplaced(url):
        raise UrlError(MISPLACED_CREDENTIAL)
    base, _, flavour = scheme.partition("+")
    if not flavour:
        mode: Mode = "node"
        one, service, db_path = url, "", ""
        nodes: tuple[tuple[str, int], ...] = ()
    else:
        mode = "cluster" if flavour == "cluster" else "sentinel"
        cut = min([i for i in (rest.find("/"), rest.find("?")) if i >= 0], default=len(rest))
        netloc, tail = rest[:cut], rest[cut:]
        creds, at, hosts = netloc.rpartition("@")
        nodes = _endpoints(hosts, 6379 if mode == "cluster" else 26379)
        path, qmark, query = tail.partition("?")
        segments = [s for s in path.split("/") if s]
        if mode == "sentinel":
            if not segments or len(segments) > 2:
                raise UrlError("a Sentinel URL names the service: redis+sentinel://host:port[,host:port]/service[/db]")
            service, db_path = segments[0], "/".join(segments[1:])
        else:
            if segments:
                raise UrlError("a Redis Cluster has no database number: redis+cluster://host:port[,host:port]")
            service, db_path = "", ""
        first = hosts.split(",")[0]
        one = f"{base}://{creds}{at}{first}/{db_path}{qmark}{query}"
    try:
        options = dict(parse_url(one))
    except ValueError as exc:
        raise UrlError(str(exc)) from None
    for name, why in _REFUSED.items():
        if name in options:
            raise UrlError(f"option '{name}' is not supported: {why}")
    # redis-py 8 opens connections with `HELLO 3` unless told otherwise; the gateway reads RESP2's replies.
    options["protocol"] = 2
    sentinel_options: dict[str, Any] = {}
    if mode == "sentinel":
        # The sentinels get the socket and TLS options; their own credentials, if any, come as
        # sentinel_username / sentinel_password (the URL's are the data nodes').
        for k in list(options):
            if k.startswith("sentinel_"):
                sentinel_options[k.removeprefix("sentinel_")] = options.pop(k)
        shared = {k: v for k, v in options.items() if k.startswith(("socket_", "ssl_")) or k == "protocol"}
        sentinel_options.update(shared)
        if base == "rediss":
            sentinel_options["connection_class"] = SSLConnection
    if mode != "node":
        options.pop("host", None)
        options.pop("port", None)
    parsed = RedisUrl(mode, options, nodes, service, sentinel_options)
    # Build one connection now: redis-py checks every option's name and value (an unknown option, a bad
    # ssl_cert_reqs) when a connection is made, which would otherwise happen on the first request.
    try:
        for conn in [parsed.connection()] + (
            [RedisUrl("node", sentinel_options).connection()] if sentinel_options else []
        ):
            if isinstance(conn, SSLConnection):
                conn.ssl_context.get()  # reads the CA, certificate and key files now, not on the first call
    except TypeError as exc:
        name = str(exc).rpartition("argument ")[2].strip("'\"") or "?"
        if name.startswith("ssl_") and not parsed.tls:
            raise UrlError(f"option '{name}' needs TLS: a rediss:// URL") from None
        raise UrlError(f"unknown option '{name}'") from None
    except OSError as exc:
        raise UrlError(f"ssl_ca_certs, ssl_certfile or ssl_keyfile cannot be read: {exc.strerror or exc}") from None
    except (RedisError, ValueError) as exc:
        raise UrlError(f"bad option: {type(exc).__name__}: {exc}") from None
    return parsed


def url_problem(url: str) -> str | None:
    """Why `redis.url` cannot be used (one line, no credentials), or None: for config validation."""
    try:
        parse_redis_url(url)
    except UrlError as exc:
        return str(exc)
    return None


def _client(parsed: RedisUrl) -> aioredis.Redis:
    timeout = parsed.timeout_s
    common: dict[str, Any] = {
        # Every call runs within `SharedState.run`'s deadline, which covers connecting, writing and reading.
        # redis-py's own timeouts are plain timers: on a busy loop they would fire before the reply that came
        # in time is read, so they are off (a connect timeout the URL sets explicitly is honoured).
        "socket_timeout": None,
        "socket_connect_timeout": parsed.options.get("socket_connect_timeout"),
        "health_check_interval": 0,
        # A pooled connection Redis dropped (it restarted, or failed over) is replaced on its next use
        # instead of failing the call, which would mean a degraded second per stale connection. One
        # immediate retry, on a dropped connection only: never on a timeout (the script may have run).
        "retry": Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
    }
    if parsed.mode == "node":
        # Not `from_url`: there the URL's options win over the gateway's.
        return aioredis.Redis.from_pool(aioredis.ConnectionPool(**{**parsed.options, **common}))
    options = {k: v for k, v in parsed.options.items() if k != "connection_class"}
    options.update(common)
    if parsed.mode == "cluster":
        # RedisCluster answers every command the gateway sends with redis-py's single-node signatures
        # (tests/ratelimit/test_cluster.py runs health, usage and limits on a real cluster).
        return cast(
            aioredis.Redis,
            RedisCluster(
                startup_nodes=[ClusterNode(h, p) for h, p in parsed.nodes],
                ssl=parsed.tls,
                # A lost node must not stop the slots that still have a master.
                require_full_coverage=False,
                **options,
            ),
        )
    sentinel_kw = {k: v for k, v in parsed.sentinel_options.items() if k != "connection_class"}
    sentinel_kw.setdefault("socket_timeout", timeout)
    sentinel_kw.setdefault("socket_connect_timeout", timeout)
    if parsed.tls:
        sentinel_kw["ssl"] = True
    # redis-py types Sentinel's constructor from 8.2 on, and not before: the ignore holds for both.
    sentinel = Sentinel(list(parsed.nodes), sentinel_kwargs=sentinel_kw)  # type: ignore[no-untyped-call, unused-ignore]
    return cast(aioredis.Redis, sentinel.master_for(parsed.service, ssl=parsed.tls, **options))


class SharedState:
    def __init__(self, url: str, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.url = url
        self.parsed: RedisUrl | None = parse_redis_url(url) if url else None
        self.client: aioredis.Redis | None = _client(self.parsed) if self.parsed is not None else None
        self.timeout_s = self.parsed.timeout_s if self.parsed is not None else _SOCKET_TIMEOUT_S
        self._clock = clock
        self._down_until = 0.0
        self._last_warning = -_WARN_EVERY_S
        self.failures = 0

    @property
    def configured(self) -> bool:
        return self.client is not None

    @property
    def cluster(self) -> bool:
        return self.parsed is not None and self.parsed.mode == "cluster"

    @property
    def degraded(self) -> bool:
        return self.client is not None and self._clock() < self._down_until

    async def run(self, op: Callable[[aioredis.Redis], Awaitable[T]]) -> T:
        """Run one Redis operation, or raise Degraded at once when Redis is absent or failing."""
        client = self.client
        if client is None or self._clock() < self._down_until:
            raise Degraded
        try:
            async with Deadline(self.timeout_s * 2):
                return await op(client)
        except (RedisError, OSError, TimeoutError) as exc:
            self.mark_down(exc)
            raise Degraded from None

    async def master_address(self, key: str) -> tuple[str, int] | None:
        """The master that holds `key`: a cluster's owner of its slot, or the master the sentinels name
        (None on one node: the URL's). Cluster: the slot table is read again, since this is asked after
        a failure that may have been a failover."""
        client, parsed = self.client, self.parsed
        if client is None or parsed is None or parsed.mode == "node":
            return None
        if parsed.mode == "cluster":
            return await self._slot_master(parsed, key_slot(key.encode()))
        # The sentinels are asked in turn by redis-py, each within the socket timeout of redis-py's own (plain)
        # timers: the pool's discovery shares these clients, and needs them to move on from a stalled sentinel.
        sentinel = cast(Any, client).connection_pool.sentinel_manager
        host, port = await sentinel.discover_master(parsed.service)
        return str(host), int(port)

    async def _slot_master(self, parsed: RedisUrl, slot: int) -> tuple[str, int]:
        """Ask the start-up nodes (in turn) which master serves `slot` now: `CLUSTER SLOTS` on a connection
        of our own, so redis-py's cached slot table, which it refreshes by itself, is left alone."""
        problem: Exception = RedisConnectionError("no start-up node answered")
        for host, port in parsed.nodes:
            # Each node is given the socket timeout (a `Deadline`, not redis-py's plain timers), then the next.
            conn = parsed.deadline_connection(host, port)
            try:
                async with Deadline(parsed.timeout_s):
                    await conn.connect()  # type: ignore[no-untyped-call]
                    await conn.send_command("CLUSTER", "SLOTS")
                    ranges = await conn.read_response()
            except (RedisError, OSError) as exc:
                problem = exc
                continue
            finally:
                await conn.disconnect(nowait=True)  # a stalled node is not waited for again
            for first, last, master, *_ in ranges:
                if int(first) <= slot <= int(last):
                    address = master[0].decode() if isinstance(master[0], bytes) else str(master[0])
                    return address or host, int(master[1])
            problem = RedisError(f"no master serves slot {slot}")
        try:
            raise problem
        finally:
            # The raised error's traceback holds this frame, whose local holds the error: a cycle per failed
            # lookup, left to the collector, unless the local goes.
            del problem

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
            # Closing waits for each connection's buffered writes, which a stalled Redis never takes: the
            # connections have no timeout of their own (`_client`), so the deadline bounds the wait.
            with contextlib.suppress(TimeoutError):
                async with Deadline(self.timeout_s * 2):
                    await self.client.aclose()
            # The sentinels' own clients are not closed with the master's.
            manager = getattr(getattr(self.client, "connection_pool", None), "sentinel_manager", None)
            for sentinel in getattr(manager, "sentinels", ()):
                await sentinel.aclose()
