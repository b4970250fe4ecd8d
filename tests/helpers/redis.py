"""Real Redis processes for the tests: one `redis-server`, a 3-master Cluster, a Sentinel set, a TLS server.

Every process is a `redis-server` on a free loopback port (never 6379), without persistence, in a
temporary directory, started in its own session and stopped (terminate, then kill) even when the test
fails. Start-up waits are bounded.
"""

from __future__ import annotations

import asyncio
import functools
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType

import redis

from gateway.limits.ratelimit import Bucket, Limiter, RedisDown
from tests.helpers.servers import free_port


class RedisServer:
    """A real `redis-server` without persistence on a loopback port that survives restarts."""

    def __init__(self, port: int | None = None) -> None:
        self.port = free_port() if port is None else port
        assert self.port != 6379
        self.proc = self._spawn()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _pong(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    @property
    def running(self) -> bool:
        return self.proc.poll() is None

    def start(self) -> None:
        assert not self.running, "already running"
        self.proc = self._spawn()

    def _spawn(self) -> subprocess.Popen[bytes]:
        args = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 10
        while not self._pong():
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                proc.wait(5)
                raise RuntimeError(f"redis-server did not start on port {self.port}")
            time.sleep(0.01)
        return proc

    def stop(self) -> None:
        proc = self.proc
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)

    def restart(self) -> None:
        self.stop()
        self.start()

    def __enter__(self) -> RedisServer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, decode_responses=True, socket_timeout=5)

    def time_ms(self) -> int:
        """Redis's own clock in whole milliseconds, as the script reads it."""
        with self.client() as r:
            sec, usec = r.time()
            return int(sec) * 1000 + int(usec) // 1000


_START_S = 20.0


def wait_for(check: Callable[[], bool], what: str, timeout: float = _START_S) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():
                return
        except (redis.RedisError, OSError):
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith((b"+PONG", b"-"))  # "-LOADING", "-NOAUTH": up all the same
    except OSError:
        return False


class Procs:
    """A set of redis-server processes in one directory; `stop` ends every one still running."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.procs: dict[int, subprocess.Popen[bytes]] = {}

    def spawn(self, port: int, *args: str, plain_port: bool = True) -> None:
        argv = ["redis-server", *args]
        if plain_port:
            argv += ["--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
            # A master waits 5 s (Redis 7's default) for more replicas before it streams a full sync to one:
            # every replica here would start 5 s late, and so would every test of a cluster or a sentinel set.
            argv += ["--repl-diskless-sync-delay", "0"]
        argv += ["--dir", str(self.workdir), "--logfile", str(self.workdir / f"{port}.log")]
        assert port != 6379
        self.procs[port] = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )

    def kill(self, port: int) -> None:
        proc = self.procs[port]
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def cluster_port(taken: Sequence[int] = ()) -> int:
    """A free port whose cluster bus port (port + 10000) is a port too, and free, neither of them one of
    `taken` or its bus port (the other nodes')."""
    busy = {*taken, *(p + 10000 for p in taken)}
    while True:
        port = free_port()
        if port + 10000 > 65535 or port in busy or port + 10000 in busy:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port


class Cluster(Procs):
    """Three masters, each with one replica, created with `redis-cli --cluster create`."""

    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir)
        self.ports: list[int] = []
        try:
            for _ in range(6):
                self.ports.append(self._node(cluster_port(self.ports)))
            subprocess.run(
                ["redis-cli", "--cluster", "create", *(f"127.0.0.1:{p}" for p in self.ports)]
                + ["--cluster-replicas", "1", "--cluster-yes"],
                check=True,
                capture_output=True,
                timeout=_START_S,
            )
            wait_for(self.healthy, "cluster_state:ok on every node with every replica in sync")
        except BaseException:
            self.stop()
            raise

    def _node(self, port: int) -> int:
        """A cluster node started on `port`, or on another when it exits at once (another process took the port
        or its bus port between the check and the start): its port."""
        for _ in range(5):
            args = ("--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{port}.conf")
            self.spawn(port, *args, "--cluster-node-timeout", "1000")
            proc = self.procs[port]
            wait_for(lambda: proc.poll() is not None or _answers(port), f"cluster node {port}")  # noqa: B023
            if proc.poll() is None:
                return port
            del self.procs[port]
            port = cluster_port([*self.ports, port])
        raise RuntimeError("no cluster node started on five ports")

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.ports[:2])

    def node(self, port: int) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=port, socket_timeout=5)

    def healthy(self) -> bool:
        for port in self.ports:
            if self.procs[port].poll() is not None:
                continue
            with self.node(port) as r:
                if b"cluster_state:ok" not in r.execute_command("CLUSTER", "INFO"):
                    return False
                info = r.info("replication")
                if info["role"] == "slave" and info.get("master_link_status") != "up":
                    return False
        return True

    def client(self) -> redis.RedisCluster:
        live = next(p for p in self.ports if self.procs[p].poll() is None)
        return redis.RedisCluster(host="127.0.0.1", port=live, socket_timeout=5)

    def master_of(self, key: str) -> int:
        with self.client() as c:
            return int(c.get_node_from_key(key).port)

    def node_id(self, port: int) -> str:
        with self.node(port) as r:
            return str(r.execute_command("CLUSTER", "MYID").decode())

    def is_master(self, port: int) -> bool:
        with self.node(port) as r:
            return bool(r.info("replication")["role"] == "master")

    def replica_of(self, master_port: int) -> int:
        with self.node(master_port) as r:
            my_id = r.execute_command("CLUSTER", "MYID").decode()
            lines = r.execute_command("CLUSTER", "REPLICAS", my_id)
        return int(lines[0].decode().split()[1].split("@")[0].rsplit(":", 1)[1])


class Sentinels(Procs):
    """A master, one replica and two sentinels (quorum 1) watching service `gw`."""

    SERVICE = "gw"

    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir)
        self.master, self.replica = free_port(), free_port()
        self.sentinels = [free_port(), free_port()]
        try:
            self.spawn(self.master)
            wait_for(lambda: _answers(self.master), "the master")
            self.spawn(self.replica, "--replicaof", "127.0.0.1", str(self.master))
            # A sentinel learns the replicas from the master's INFO, which it asks for at once and then every 10 s:
            # started before the replica is attached, it would name none for 10 s.
            wait_for(self._replica_in_sync, "the replica in sync")
            for port in self.sentinels:
                conf = workdir / f"sentinel-{port}.conf"
                conf.write_text(
                    f"port {port}\nbind 127.0.0.1\n"
                    f"sentinel monitor {self.SERVICE} 127.0.0.1 {self.master} 1\n"
                    f"sentinel down-after-milliseconds {self.SERVICE} 1000\n"
                    f"sentinel failover-timeout {self.SERVICE} 5000\n"
                )
                self.spawn(port, str(conf), "--sentinel", plain_port=False)
            for port in self.sentinels:
                wait_for(functools.partial(_answers, port), f"sentinel {port}")
            wait_for(self._ready, "the replica known to every sentinel")
        except BaseException:
            self.stop()
            raise

    @property
    def url(self) -> str:
        return "redis+sentinel://" + ",".join(f"127.0.0.1:{p}" for p in self.sentinels) + f"/{self.SERVICE}"

    def sentinel(self, port: int) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=port, socket_timeout=5, decode_responses=True)

    def master_port(self) -> int:
        with self.sentinel(self.sentinels[0]) as s:
            return int(s.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.SERVICE)[1])

    def _replica_in_sync(self) -> bool:
        with redis.Redis(host="127.0.0.1", port=self.replica, socket_timeout=5) as r:
            return bool(r.info("replication").get("master_link_status") == "up")

    def _ready(self) -> bool:
        if not self._replica_in_sync():
            return False
        for port in self.sentinels:
            with self.sentinel(port) as s:
                if not s.execute_command("SENTINEL", "REPLICAS", self.SERVICE):
                    return False
        return True

    def failover(self) -> None:
        """SENTINEL FAILOVER: the replica is promoted and the old master made its replica."""
        old = self.master_port()
        with self.sentinel(self.sentinels[0]) as s:
            s.execute_command("SENTINEL", "FAILOVER", self.SERVICE)
        wait_for(lambda: self.master_port() != old, "the sentinels to name a new master")


class TlsServer(Procs):
    """One redis-server that speaks only TLS, with a certificate for 127.0.0.1 from a throwaway CA."""

    def __init__(self, workdir: Path) -> None:
        import trustme

        super().__init__(workdir)
        ca = trustme.CA()
        cert = ca.issue_cert("127.0.0.1")
        self.ca_file = workdir / "ca.pem"
        ca.cert_pem.write_to_path(str(self.ca_file))
        cert.private_key_pem.write_to_path(str(workdir / "server.key"))
        cert.cert_chain_pems[0].write_to_path(str(workdir / "server.pem"))
        self.port = free_port()
        try:
            self.spawn(
                self.port,
                "--port",
                "0",
                "--tls-port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--tls-cert-file",
                str(workdir / "server.pem"),
                "--tls-key-file",
                str(workdir / "server.key"),
                "--tls-ca-cert-file",
                str(self.ca_file),
                "--tls-auth-clients",
                "no",
                plain_port=False,
            )
            wait_for(self._up, "the TLS redis-server")
        except BaseException:
            self.stop()
            raise

    def _up(self) -> bool:
        with redis.Redis(
            host="127.0.0.1", port=self.port, ssl=True, ssl_ca_certs=str(self.ca_file), socket_timeout=2
        ) as r:
            return bool(r.ping())

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, ssl=True, ssl_ca_certs=str(self.ca_file), socket_timeout=5)


class Tally:
    """What a load run through a disruption saw: every outcome counted, anything unexpected kept."""

    def __init__(self) -> None:
        self.allowed = 0
        self.refused = 0
        self.redis_down = 0
        self.unexpected: list[BaseException] = []
        self.seconds = 0.0


async def load_through(
    limiter: Limiter, buckets: list[Bucket], disrupt: Callable[[], None], *, workers: int = 4, max_s: float = 40.0
) -> Tally:
    """Acquire (and release) from `workers` tasks for a second, run `disrupt` in a thread, keep going until
    the limiter has used Redis again for a second (or `max_s`), then stop."""
    tally = Tally()
    stop = False

    async def worker() -> None:
        while not stop:
            try:
                d = await limiter.acquire(buckets, 0)
            except RedisDown:
                tally.redis_down += 1
            except Exception as exc:  # anything else is a failure beyond the configured fail mode
                tally.unexpected.append(exc)
            else:
                if d.allowed:
                    tally.allowed += 1
                    await limiter.release(buckets, d.lease)
                else:
                    tally.refused += 1
            await asyncio.sleep(0.01)

    start = time.monotonic()
    tasks = [asyncio.ensure_future(worker()) for _ in range(workers)]
    try:
        await asyncio.sleep(1.0)
        await asyncio.to_thread(disrupt)
        healthy_since: float | None = None
        while time.monotonic() - start < max_s:
            await asyncio.sleep(0.1)
            if limiter.shared.degraded:
                healthy_since = None
            elif healthy_since is None:
                healthy_since = time.monotonic()
            elif time.monotonic() - healthy_since >= 1.0:
                break
    finally:
        stop = True
        await asyncio.gather(*tasks, return_exceptions=True)
    tally.seconds = time.monotonic() - start
    return tally
