"""`redis.url`: every option honoured by both Redis clients or refused at start-up, and the rate-limit
channel proven against redis-py over the same hostile inputs.

Before, the channel opened its own socket with a default TLS context and ignored `ssl_ca_certs` and
`ssl_cert_reqs`, so a `rediss://` URL that redis-py accepted failed the channel and silently dropped
limits to per-process counting. Now the channel's connection is set up by redis-py's connection class
from the same parsed URL; these tests hold that against a real TLS redis-server.
"""

from __future__ import annotations

import random
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from gateway.config import ConfigError, load_config
from gateway.limits.ratelimit import _SHA, SCRIPT, Bucket, Kind, Limiter, RedisDown
from gateway.limits.scriptchannel import ScriptChannel, command
from gateway.state import Degraded, SharedState, url_problem
from tests.helpers.redis import RedisServer, TlsServer, wait_for
from tests.helpers.servers import free_port

pytestmark = pytest.mark.timeout(60)
# The default socket timeouts (0.25 s) are shorter than a TLS handshake can take on a loaded machine; these tests
# are about what the URL's TLS options do, so they give the handshake time.
_PATIENT = "socket_timeout=5&socket_connect_timeout=5"


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsServer]:
    made = TlsServer(tmp_path_factory.mktemp("tls"))
    try:
        yield made
    finally:
        made.stop()


async def charged(url: str, scope: str) -> bool:
    """One acquire through the channel, fail closed: True if Redis admitted it, False if Redis was down."""
    shared = SharedState(url)
    limiter = Limiter(shared, fail_open=False)
    try:
        return (await limiter.acquire([Bucket(scope=scope, kind="rpm", limit=5)], 0)).allowed
    except RedisDown:
        return False
    finally:
        await limiter.close()
        await shared.close()


async def test_rediss_with_the_urls_ca_reaches_redis(tls: TlsServer) -> None:
    url = f"rediss://127.0.0.1:{tls.port}/0?ssl_ca_certs={tls.ca_file}&ssl_cert_reqs=required&{_PATIENT}"
    assert await charged(url, "key:tls")
    with tls.client() as r:
        assert r.exists("rl:{key:tls}:rpm")
    shared = SharedState(url)
    try:
        assert await shared.ping()  # the pool, from the same URL
    finally:
        await shared.close()


async def test_rediss_verifies_the_server_unless_the_url_says_not_to(tls: TlsServer) -> None:
    # The throwaway CA is not in the system store: verification fails, on both clients.
    assert not await charged(f"rediss://127.0.0.1:{tls.port}/0", "key:unverified")
    assert await charged(f"rediss://127.0.0.1:{tls.port}/0?ssl_cert_reqs=none&{_PATIENT}", "key:unverified")
    with tls.client() as r:
        assert r.exists("rl:{key:unverified}:rpm")


@pytest.fixture
def locked(tmp_path: Path) -> Iterator[int]:
    """A redis-server with an ACL user `gw` (password `pw`) and a default user that may do nothing."""
    port = free_port()
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        + ["--dir", str(tmp_path), "--user", "default", "off", "--user", "gw", "on", ">pw", "~*", "&*", "+@all"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_for(
            lambda: redis.Redis(host="127.0.0.1", port=port, username="gw", password="pw").ping(), "the ACL server"
        )
        yield port
    finally:
        proc.terminate()
        proc.wait(10)


async def test_credentials_db_and_client_name_reach_both_clients(locked: int) -> None:
    url = f"redis://gw:pw@127.0.0.1:{locked}/3?client_name=gw-limits"
    shared = SharedState(url)
    limiter = Limiter(shared, fail_open=False)
    try:
        assert (await limiter.acquire([Bucket(scope="key:acl", kind="rpm", limit=5)], 0)).allowed
        assert await shared.ping()
        with redis.Redis(host="127.0.0.1", port=locked, username="gw", password="pw", db=3, decode_responses=True) as r:
            assert r.exists("rl:{key:acl}:rpm")
            names = [c for c in r.client_list() if c["name"] == "gw-limits"]
            assert len(names) >= 2 and all(c["db"] == "3" and c["user"] == "gw" for c in names)
    finally:
        await limiter.close()
        await shared.close()
    assert not await charged(f"redis://gw:wrong@127.0.0.1:{locked}/3", "key:acl")


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("redis://127.0.0.1:1/0?foo=1", "unknown option 'foo'"),
        ("redis://:s3cret@127.0.0.1:1/0?decode_responses=true", "option 'decode_responses' is not supported"),
        ("redis://127.0.0.1:1/0?protocol=3", "option 'protocol' is not supported"),
        ("redis://127.0.0.1:1/0?retry_on_timeout=true", "option 'retry_on_timeout' is not supported"),
        ("redis://127.0.0.1:1/0?timeout=5", "option 'timeout' is not supported"),
        ("redis://:s3cret@127.0.0.1:1/0?ssl_ca_certs=/ca.pem", "option 'ssl_ca_certs' needs TLS"),
        ("rediss://:s3cret@127.0.0.1:1/0?ssl_cert_reqs=sometimes", "Invalid SSL Certificate Requirements"),
        ("rediss://127.0.0.1:1/0?ssl_ca_certs=/nonexistent/ca.pem", "ssl_ca_certs, ssl_certfile or ssl_keyfile"),
        ("redis+cluster://:s3cret@a:1,b:2/1", "a Redis Cluster has no database number"),
        ("redis+sentinel://:s3cret@a:1,b:2", "a Sentinel URL names the service"),
        ("redis+sentinel://a:1,b:x/gw", "bad host:port"),
        ("unix+cluster:///tmp/r.sock", "must start with one of"),
        ("http://:s3cret@127.0.0.1:1", "must start with one of"),
        # A password whose `/`, `#` or `?` is not percent-encoded: redis-py's own error quoted a piece of it.
        ("redis://:s3cret/Tail@127.0.0.1:6379/0", "percent-encode"),
        ("redis://:s3cret#Tail@127.0.0.1:6379/0", "percent-encode"),
        ("redis://:s3cret?Tail@127.0.0.1:6379/0", "percent-encode"),
        ("redis+sentinel://:s3cret/Tail@a:1/gw", "percent-encode"),
    ],
)
def test_a_url_the_gateway_cannot_honour_is_refused_at_start_up(tmp_path: Path, url: str, problem: str) -> None:
    found = url_problem(url)
    assert found is not None and problem in found and "s3cret" not in found
    path = tmp_path / "gw.yaml"
    path.write_text(f'redis: {{url: "{url}"}}\nproviders: {{demo: {{kind: fake}}}}\n')
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == f"{path}: redis.url: {found}" and "\n" not in str(err.value)


@pytest.mark.parametrize(
    "url",
    [
        "redis://127.0.0.1:1/0",
        "unix:///tmp/redis.sock?db=2",
        "rediss://u:p@h:6380/1?ssl_cert_reqs=none&ssl_check_hostname=false&client_name=x&socket_timeout=0.5",
        "redis+cluster://a:7000,b:7001,[::1]:7002?socket_connect_timeout=0.2",
        "rediss+cluster://a:7000?ssl_cert_reqs=optional",
        "redis+sentinel://s1:26379,s2/gw/2?sentinel_password=sp&max_connections=5",
        "rediss+sentinel://u:p@s1/gw?ssl_cert_reqs=none",
        "redis://:s3cret%2FTail%23x@127.0.0.1:6379/0",
    ],
)
def test_the_documented_url_forms_are_accepted(url: str) -> None:
    assert url_problem(url) is None


# ------------------------------------------------------------------------------------------------------
# Differential: the channel against redis-py, the same hostile inputs, the same answers.

_HOSTILE: list[bytes] = [
    b"",
    b"\r\n",
    b"*1\r\n$4\r\nPING\r\n",
    b"$-1\r\n",
    b"-ERR not an error\r\n",
    b"\x00\xff\xfe",
    "ünïcødé {tag} }{".encode(),
    b"x" * 70_000,
    b"9" * 40,
    b"-1",
    b"{",
    b"}",
    b":",
]


async def test_raw_commands_answer_like_redis_py(rds: RedisServer) -> None:
    shared = SharedState(rds.url)
    channel = ScriptChannel(shared, SCRIPT, "rl:")
    lib = redis.asyncio.Redis.from_url(rds.url)
    echo_script = b"return {KEYS[1], ARGV[1], #ARGV[1], tonumber(ARGV[2])}"
    # Keys start with "@", each side's own namespace: the commands write.
    cases: list[list[bytes]] = []
    for value in _HOSTILE:
        cases.append([b"ECHO", value])
        cases.append([b"EVAL", echo_script, b"1", b"@k" + value, value, value])
        cases.append([b"SET", b"@diff:" + value, value])
        cases.append([b"GET", b"@diff:" + value])
        cases.append([b"INCR", b"@diff:" + value])  # an error reply for most values
        cases.append([b"EVALSHA", b"0" * 40, b"0"])  # NOSCRIPT for an unknown script: refused, not run
    try:
        for parts in cases:
            try:
                theirs = await lib.execute_command(*[p.replace(b"@", b"lib:", 1) for p in parts])  # type: ignore[no-untyped-call]
            except redis.ResponseError:
                theirs = "error reply"
            try:
                ours = await channel.call(command(*[p.replace(b"@", b"chan:", 1) for p in parts]))
            except Degraded:  # the channel's answer to an error reply: the call did not run
                ours = "error reply"
            if parts[0] == b"EVAL":
                ours[0], theirs[0] = ours[0].removeprefix(b"chan:"), theirs[0].removeprefix(b"lib:")
            assert ours == theirs, parts[:2]
    finally:
        await channel.close()
        await lib.aclose()
        await shared.close()


async def test_the_limit_script_answers_like_redis_py(rds: RedisServer) -> None:
    """The same random calls (hostile scope names, odd costs, every kind) by the Limiter through the
    channel and by redis-py's `evalsha`, on twin keys: the same decisions, remaining counts and resets.
    Kinds whose arithmetic moves by less than a unit per second (tpd, concurrent) keep it exact."""
    rng = random.Random(1234)
    shared = SharedState(rds.url)
    limiter = Limiter(shared, fail_open=False)
    lib = redis.asyncio.Redis.from_url(rds.url)
    await lib.script_load(SCRIPT)
    kinds: list[Kind] = ["tpd", "concurrent"]
    try:
        for _ in range(150):
            scope = rng.choice(_HOSTILE[:7] + _HOSTILE[9:]).decode(errors="replace") + uuid.uuid4().hex[:4]
            buckets = [
                Bucket(scope=f"ours:{scope}:{i}", kind=rng.choice(kinds), limit=rng.choice([1, 3, 1000]))
                for i in range(rng.randint(1, 4))
            ]
            twins = [Bucket(scope="theirs" + b.scope.removeprefix("ours"), kind=b.kind, limit=b.limit) for b in buckets]
            tokens = rng.choice([0, 1, 7, 999, 10**6, 10**12])
            for _repeat in range(rng.randint(1, 4)):
                ours = await limiter.acquire(buckets, tokens)
                argv: list[Any] = ["acquire", "lease-" + uuid.uuid4().hex]
                for b in twins:
                    argv += [b.kind, b.limit, b.period_ms, tokens if b.kind == "tpd" else 1]
                theirs = await lib.evalsha(_SHA.decode(), len(twins), *[b.redis_key for b in twins], *argv)
                # Resets and waits count down one per millisecond between the two calls: within 50 ms.
                assert int(ours.allowed) == int(theirs[0]) and abs(ours.retry_after_ms - int(theirs[1])) <= 50
                assert [s.remaining for s in ours.states] == [int(x) for x in theirs[2::2]], (buckets, tokens)
                assert all(abs(s.reset_ms - int(x)) <= 50 for s, x in zip(ours.states, theirs[3::2], strict=True))
    finally:
        await limiter.close()
        await lib.aclose()
        await shared.close()


async def test_both_clients_speak_resp2_whatever_redis_py_defaults_to(rds: RedisServer) -> None:
    # redis-py 8 says `HELLO 3` by default; the gateway's reply handling (the channel's parser, the reply
    # shapes it reads) is RESP2's, so every connection it opens asks for RESP2.
    shared = SharedState(rds.url)
    limiter = Limiter(shared, fail_open=False)
    try:
        assert (await limiter.acquire([Bucket(scope="key:resp", kind="rpm", limit=5)], 0)).allowed
        assert await shared.ping()
        with redis.Redis(host="127.0.0.1", port=rds.port, protocol=2, decode_responses=True) as r:
            mine = r.client_id()
            others = [c for c in r.client_list() if int(c["id"]) != mine]
        assert len(others) >= 2  # the shared client's pool and the script channel
        assert {c["resp"] for c in others} == {"2"}
    finally:
        await limiter.close()
        await shared.close()
