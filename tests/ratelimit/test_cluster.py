"""Redis Cluster: limits, cooldowns and usage on a real 3-master cluster, and a master killed mid-load.

`redis+cluster://host:port,host:port` names start-up nodes; the rest of the cluster is discovered.
Every rate-limit key carries the `{rl}` hash tag, so one request's buckets of every scope (key,
provider, ...) sit in one slot and are still checked and charged by one atomic script; the channel
talks to that slot's master and follows it through a failover (MOVED, or the connection lost).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import gc
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from gateway.limits.ratelimit import Bucket, Limiter
from gateway.state import SharedState
from tests.helpers.clients import body, client
from tests.helpers.identity import bucket, month_spend, usage
from tests.helpers.redis import Cluster, load_through
from tests.helpers.servers import free_port, serve_config
from tests.helpers.waiting import wait_until

pytestmark = pytest.mark.timeout(120)

CONFIG = """
redis: {{url: "{url}", on_failure: fail_closed}}
keys:
  - {{name: four, key: k-four, limits: {{rpm: 4, concurrent: 3}}}}
  - {{name: wide, key: k-wide}}
cooldown: {{min_requests: 1}}  # one failure cools: the cooldown keys must land on the cluster
providers:
  demo: {{kind: fake, limits: {{rpm: 1000}}}}
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    made = Cluster(tmp_path_factory.mktemp("cluster"))
    try:
        yield made
    finally:
        made.stop()


@pytest.fixture
def own_cluster(tmp_path: Path) -> Iterator[Cluster]:
    """A cluster of the test's own, for a test that kills one of its masters."""
    made = Cluster(tmp_path)
    try:
        yield made
    finally:
        made.stop()


def test_limits_cooldowns_and_usage_live_on_the_cluster(cluster: Cluster, tmp_path: Path) -> None:
    """A direct request charges its key's and its provider's buckets in one script call: on a cluster
    that works only because both keys share the `{rl}` slot (without it: CROSSSLOT, and fail_closed
    answers 503). Usage (two slots per booking) and cooldowns land on the cluster too."""
    with serve_config(tmp_path, CONFIG.format(url=cluster.url)) as gw:
        with client(gw.url, "k-four") as c:
            codes = [c.post("/v1/completions", json=body("demo/long")).status_code for _ in range(5)]
        assert codes == [200, 200, 200, 200, 429]
        with client(gw.url) as c:
            assert c.get("/ready").json() == {"status": "ready", "redis": "ok"}
        with client(gw.url, "k-wide") as c:
            # Cooldowns are per-target keys (`gw:{target}:...`): a 500 from the upstream cools the target.
            assert c.post("/v1/completions", json=body("demo/error-500")).status_code == 502
    with cluster.client() as r:
        assert r.exists("{rl}" + bucket("k-four", "rpm")) and r.exists("{rl}rl:{provider:demo}:rpm")
        day = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d")
        assert int(r.hget(usage(day, "k-four"), "requests:demo/other") or 0) == 4
        assert any(b"demo/error-500" in k for k in r.scan_iter(match="gw:*", target_nodes="all"))


async def test_one_slot_for_every_bucket_of_a_call(cluster: Cluster) -> None:
    """Buckets of four scopes in one call: admitted all or nothing, on the master of `{rl}`."""
    shared = SharedState(cluster.url)
    limiter = Limiter(shared, fail_open=False)
    tag = uuid.uuid4().hex[:8]
    buckets = [
        Bucket(scope=f"key:{tag}", kind="rpm", limit=3),
        # Intervals of 6 s and more: nothing refills between the calls, even on a loaded machine.
        Bucket(scope=f"model:{tag}", kind="rpm", limit=10),
        Bucket(scope=f"provider:{tag}", kind="tpd", limit=1000),
        Bucket(scope=f"deployment:{tag}", kind="concurrent", limit=10),
    ]
    try:
        decisions = [await limiter.acquire(buckets, 10) for _ in range(4)]
        assert [d.allowed for d in decisions] == [True, True, True, False]
        assert [s.remaining for s in decisions[2].states] == [0, 7, 970, 7]
        # The status page's read-only view (a redis-py pipeline on the cluster) agrees.
        assert [s.remaining for s in await limiter.peek(buckets)] == [0, 7, 970, 7]
        master = cluster.master_of("{rl}")
        with cluster.node(master) as r:
            assert r.exists(*[f"{{rl}}{b.redis_key}" for b in buckets]) == 4
        for d in decisions[:3]:
            await limiter.release(buckets, d.lease)
        with cluster.node(master) as r:
            assert r.zcard(f"{{rl}}{buckets[3].redis_key}") == 0
    finally:
        await limiter.close()
        await shared.close()


async def test_merged_calls_of_many_scopes_on_the_cluster(cluster: Cluster) -> None:
    """Admissions of many scopes queued in one tick go as one script call (the `batch` mode) naming all
    their keys: on a cluster that works because every key is in the `{rl}` slot. Exact per scope."""
    shared = SharedState(cluster.url)
    limiter = Limiter(shared, fail_open=False)
    tag = uuid.uuid4().hex[:8]
    buckets = [Bucket(scope=f"key:{tag}-{i}", kind="rpm", limit=2) for i in range(10)]
    try:
        decisions = await asyncio.gather(*(limiter.acquire([b], 0) for b in buckets for _ in range(3)))
        assert [d.allowed for d in decisions] == [True, True, False] * 10
        assert [s.remaining for s in await limiter.peek(buckets)] == [0] * 10
    finally:
        await limiter.close()
        await shared.close()


@pytest.mark.parametrize("fail_open", [True, False])
async def test_a_master_killed_mid_load(own_cluster: Cluster, fail_open: bool) -> None:
    """The master of the `{rl}` slot is killed (SIGKILL) under load; its replica takes over after the
    node timeout (1 s here). Nothing fails beyond the fail mode (fail_open: local limits, fail_closed:
    RedisDown), the channel ends up on the new master, and the bucket admits at most what a second bucket
    of the same limit would over the run (one burst L plus its rate): the documented bound per process."""
    cluster = own_cluster
    shared = SharedState(cluster.url)
    limiter = Limiter(shared, fail_open=fail_open)
    limit = 30
    buckets = [Bucket(scope="key:failover", kind="rpm", limit=limit)]
    old = cluster.master_of("{rl}")
    try:
        tally = await load_through(limiter, buckets, lambda: cluster.kill(old))
        assert tally.unexpected == []
        assert tally.redis_down == 0 if fail_open else tally.redis_down > 0
        one_bucket = limit + tally.seconds * limit / 60  # what one bucket admits over the run
        assert limit <= tally.allowed <= 2 * one_bucket, vars(tally)
        new = cluster.master_of("{rl}")
        assert new != old
        # Redis again, on the promoted replica: the bucket the load charged is there.
        d = await limiter.acquire(buckets, 0)
        assert not d.allowed
        with cluster.node(new) as r:
            assert r.exists("{rl}rl:{key:failover}:rpm")
    finally:
        await limiter.close()
        await shared.close()


async def test_the_channel_follows_the_rl_slot_through_a_migration(cluster: Cluster) -> None:
    """Resharding the `{rl}` slot to another master: while it migrates, a call whose keys are new is
    answered ASK and goes to the target (which does not know the script yet); once the slot has moved,
    MOVED makes the target the channel's node. No call is refused or counted twice on the way."""
    shared = SharedState(cluster.url)
    limiter = Limiter(shared, fail_open=False)
    old_bucket = [Bucket(scope="key:" + uuid.uuid4().hex[:8], kind="rpm", limit=5)]
    try:
        assert (await limiter.acquire(old_bucket, 0)).allowed  # connected to the slot's master
        with cluster.client() as c:
            slot = c.keyslot("{rl}")
        source = cluster.master_of("{rl}")
        target = next(p for p in cluster.ports if p != source and cluster.is_master(p))
        src_id, dst_id = cluster.node_id(source), cluster.node_id(target)
        with cluster.node(target) as r:
            r.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
            r.script_flush()
        with cluster.node(source) as r:
            r.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
        new_bucket = [Bucket(scope="key:" + uuid.uuid4().hex[:8], kind="rpm", limit=5)]
        assert (await limiter.acquire(new_bucket, 0)).allowed  # ASK: written on the target
        with cluster.node(target) as r:
            assert r.execute_command("ASKING") and r.exists("{rl}" + new_bucket[0].redis_key)
        with cluster.node(source) as r:
            keys = r.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 1000)
            if keys:
                r.execute_command("MIGRATE", "127.0.0.1", target, "", 0, 5000, "KEYS", *keys)
        for port in cluster.ports:
            if cluster.procs[port].poll() is None and cluster.is_master(port):
                with cluster.node(port) as r:
                    r.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
        # MOVED: the old bucket's count (1 of 5) went with the slot, and the channel follows it.
        states = [await limiter.acquire(old_bucket, 0) for _ in range(5)]
        assert [d.allowed for d in states] == [True, True, True, True, False]
        assert cluster.master_of("{rl}") == target
    finally:
        await limiter.close()
        await shared.close()


async def test_a_silent_start_up_node_costs_the_socket_timeout_and_the_next_one_is_asked(cluster: Cluster) -> None:
    """The slot's master is asked of the start-up nodes in turn, each within the socket timeout (a `Deadline`;
    redis-py's own timers are off): a node that accepts and never answers costs that long, then the next answers."""
    timeout_s = 0.1
    with socket.create_server(("127.0.0.1", 0)) as silent:  # the kernel accepts for it; nothing ever answers
        port = silent.getsockname()[1]
        shared = SharedState(
            f"redis+cluster://127.0.0.1:{port},127.0.0.1:{cluster.ports[0]}?socket_timeout={timeout_s}"
        )
        try:
            started = time.monotonic()
            address = await shared.master_address("{rl}")
            waited = time.monotonic() - started
        finally:
            await shared.close()
    assert address == ("127.0.0.1", cluster.master_of("{rl}"))
    assert timeout_s * 0.9 <= waited < timeout_s + 0.4


async def test_no_start_up_node_answering_is_the_last_nodes_error_and_leaves_no_cycle() -> None:
    """Every start-up node refusing: the lookup raises the last node's error (the channel then fails its
    calls as Redis down) and, like every path a failing Redis takes often, leaves no reference cycle for the
    collector: the error's traceback holds the lookup's frame, which must not hold the error in turn."""
    shared = SharedState(f"redis+cluster://127.0.0.1:{free_port()},127.0.0.1:{free_port()}?socket_timeout=0.5")
    lookup = SharedState._slot_master.__code__
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        raised: type[BaseException] | None = None
        try:
            await shared.master_address("{rl}")
        except (RedisError, OSError) as exc:
            raised = type(exc)
        gc.collect()
        cycled = [o for o in gc.garbage if getattr(o, "f_code", None) is lookup]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        await shared.close()
    assert raised is not None and issubclass(raised, RedisConnectionError)
    assert cycled == []


MONTHLY = """
redis: {{url: "{url}"}}
keys:
  - {{name: capped, key: k-capped, team: ops, max_cost_per_month: 0.03}}
teams:
  ops: {{max_cost_per_day: 1}}
prices:
  demo/long: {{prompt_per_1m: 1000, completion_per_1m: 2000}}
providers:
  demo: {{kind: fake}}
"""


def test_monthly_and_team_spend_counters_live_on_the_cluster(cluster: Cluster, tmp_path: Path) -> None:
    """Without a ledger a booking also adds to the key's month and the team's day and month counters, each
    its own slot; a budget check reads them with the day's usage hash in one pipeline across the nodes."""
    name = f"capped-{uuid.uuid4().hex[:8]}"  # the module's cluster outlives the test: a fresh key's counters
    with serve_config(tmp_path, MONTHLY.format(url=cluster.url).replace("name: capped", f"name: {name}")) as gw:
        with client(gw.url, "k-capped") as c:
            assert [c.post("/v1/completions", json=body("demo/long")).status_code for _ in range(2)] == [200, 200]
            wait_until(lambda: c.post("/v1/completions", json=body("demo/long")).status_code == 429, timeout=5)
            refused = c.post("/v1/completions", json=body("demo/long")).json()["error"]["message"]
    assert refused.startswith(f"Key '{name}' has reached its monthly budget of $0.03 ($0.034 spent this month")
    day = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d")
    with cluster.client() as r:
        assert int(r.get(month_spend(day[:7], "k-capped")) or 0) == 34 * 10**9
        assert int(r.get(f"spend:{day}:team:ops") or 0) >= 34 * 10**9
