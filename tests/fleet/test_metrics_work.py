"""What a hostile replica's `/metrics` may make the gateway do: bounded work per read, however the bytes are
cut, and failed reads spaced out (docs/fleets.md "Engine load"). Real sockets: replicas that write raw
bytes from threads of this process, a gateway in a process of its own whose CPU time is read from /proc.

The memory and log bounds of the same reads are in test_hostile_metrics.py.
"""

from __future__ import annotations

import os
import socket
import socketserver
import ssl
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import trustme

from gateway.fleet.engine import read_load
from gateway.fleet.exposition import Unreadable
from gateway.fleet.metered import MAX_HEAD, pool
from gateway.fleet.picker import EngineLoad
from providers.engine import VLLM_GAUGES
from tests.helpers.servers import GatewayProcess, cli_env
from tests.helpers.waiting import wait_until
from tests.security.httpx_rig import Proxy

from .conftest import fleet_config

ADMIN = {"authorization": "Bearer admin-fleet-key"}
GOOD = b'vllm:num_requests_waiting{model_name="m"} 0.0\nvllm:num_requests_running{model_name="m"} 1.0\n'
PLAIN = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: %d\r\n\r\n"
CHUNKED = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ntransfer-encoding: chunked\r\n\r\n"
INTERIM = b"HTTP/1.1 100 Continue\r\n\r\n"
# A line just under 64 KiB in chunks of one byte each: the most framing, and the longest carried line.
ONE_BYTE_CHUNKS = b"".join(b"1\r\n%c\r\n" % c for c in b"a" * 65000 + b"\n")


def answer(body: bytes) -> bytes:
    return PLAIN % len(body) + body


class Replica(socketserver.ThreadingTCPServer):
    """A replica over a plain socket: every request gets `first`, then `flood` over and over until the
    gateway hangs up (none: the connection is kept for the next request). Records each request's arrival
    and the end of its answer."""

    daemon_threads = True
    block_on_close = False

    def __init__(self, first: bytes, flood: bytes = b"", tls: ssl.SSLContext | None = None) -> None:
        self.first, self.flood, self.tls = first, flood, tls
        self.reads: list[tuple[float, float]] = []
        super().__init__(("127.0.0.1", 0), _Answer)
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"

    def close(self) -> None:
        self.shutdown()
        self.server_close()
        self._thread.join(5)

    def gaps(self) -> list[float]:
        """From the end of each answer to the next request."""
        reads = list(self.reads)
        return [b[0] - a[1] for a, b in zip(reads, reads[1:], strict=False)]


class _Answer(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        server = self.server
        assert isinstance(server, Replica)
        if server.tls is None:
            self._answer(server, self.request)
            return
        try:
            sock = server.tls.wrap_socket(self.request, server_side=True)
        except OSError:
            return
        with sock:
            self._answer(server, sock)

    @staticmethod
    def _answer(server: Replica, sock: socket.socket) -> None:
        pending = b""
        while True:
            while b"\r\n\r\n" not in pending:
                try:
                    data = sock.recv(65536)
                except OSError:
                    return
                if not data:
                    return
                pending += data
            pending = pending.partition(b"\r\n\r\n")[2]
            arrived = time.monotonic()
            try:
                sock.sendall(server.first)
                while server.flood:
                    sock.sendall(server.flood)
            except OSError:
                return
            finally:
                server.reads.append((arrived, time.monotonic()))


@pytest.fixture
def replicas(request: pytest.FixtureRequest) -> Iterator[list[Replica]]:
    made: list[Replica] = []

    def close() -> None:
        for r in made:
            r.close()

    request.addfinalizer(close)
    yield made


def cpu_s(pid: int) -> float:
    """User and system CPU time a process has used, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def status(url: str) -> list[dict[str, object]]:
    with httpx.Client(trust_env=False, timeout=5) as c:
        fleets: list[dict[str, object]] = c.get(f"{url}/admin/status", headers=ADMIN).json()["fleets"]["engine"]
        return fleets


def gateway(tmp_path: Path, reps: list[Replica], routing: str) -> GatewayProcess:
    config = tmp_path / "fleet.yaml"
    config.write_text(fleet_config([], routing, replicas=", ".join(r.url for r in reps)))
    gw = GatewayProcess(config, cli_env())
    gw.wait_ready()
    return gw


def test_millions_of_foreign_lines_leave_the_loop_free_and_the_wanted_sample_is_read(
    tmp_path: Path, replicas: list[Replica]
) -> None:
    # A million 4-byte samples of a series nobody asked for, then the wanted one: just under 4 MiB, a quarter
    # of the cap here, so that the reads are not heavy and keep their 250 ms pace (the loop is measured under
    # them, not under their backoff).
    tiny = answer(b"a 0\n" * 1_000_000 + b'vllm:num_requests_waiting{model_name="m"} 3\n')
    replicas += [Replica(tiny), Replica(tiny), Replica(answer(GOOD))]
    routing = "policy: least_outstanding, engine_metrics: true, metrics_interval_ms: 250, metrics_max_bytes: 16777216"
    gw = gateway(tmp_path, replicas, routing)
    try:
        wait_until(lambda: status(gw.url)[2]["engine"] is not None, timeout=10)
        latencies = []
        with httpx.Client(trust_env=False, timeout=10) as c:
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline:
                t = time.perf_counter()
                assert c.get(f"{gw.url}/health").status_code == 200
                latencies.append(time.perf_counter() - t)
                time.sleep(0.02)
        shown = status(gw.url)
    finally:
        gw.stop()
    # The loop is free between the reads' pieces: /health answers as on an idle gateway, about 2 ms. (Were
    # every line a Python step, each 64 KiB piece would hold the loop 25 ms: a median of 50 ms.)
    assert statistics.median(latencies) < 0.015, sorted(latencies)
    assert [s["engine"] for s in shown[:2]] == [{"waiting": 3.0, "running": 0.0, "kv_usage": None}] * 2, shown
    assert min(len(r.reads) for r in replicas[:2]) >= 5, [len(r.reads) for r in replicas]  # each read whole


def test_one_byte_chunks_and_interim_floods_cost_little_cpu_and_failed_reads_back_off(
    tmp_path: Path, replicas: list[Replica]
) -> None:
    replicas += [Replica(CHUNKED, ONE_BYTE_CHUNKS), Replica(b"", INTERIM * 4000), Replica(answer(GOOD))]
    gw = gateway(tmp_path, replicas, "policy: least_outstanding, engine_metrics: true, metrics_interval_ms: 250")
    try:
        wait_until(lambda: status(gw.url)[2]["engine"] is not None, timeout=10)
        time.sleep(0.5)
        start, cpu_start = time.monotonic(), cpu_s(gw.proc.pid)
        time.sleep(4)
        cpu = cpu_s(gw.proc.pid) - cpu_start
        elapsed = time.monotonic() - start
        shown = status(gw.url)
    finally:
        gw.stop()
    # Each read is cut near its cap (4 MiB counting each chunk as 1 KiB: 4,096 chunks; a 64 KiB head), about
    # 0.1 s of CPU, and failed reads back off: about 15 % of a core here, most of it in the first reads. Read
    # to their 2 s timeout back to back, these two replicas would keep the loop busy all the time.
    assert cpu < 0.3 * elapsed, (cpu, elapsed)
    assert shown[0]["engine_error"] == "larger than 4194304 bytes", shown
    assert shown[1]["engine_error"] == f"a head larger than {MAX_HEAD} bytes", shown
    assert shown[2]["engine"] == {"waiting": 0.0, "running": 1.0, "kv_usage": None}, shown
    for r in replicas[:2]:
        gaps = r.gaps()
        # Never at once after a failed read: at least the interval, then twice as long per failure in a row.
        assert len(gaps) >= 3, gaps
        assert min(gaps) > 0.2, gaps
        assert gaps[2] > 0.8, gaps


def test_a_load_buried_under_work_just_below_the_caps_is_read_ever_less_often(
    tmp_path: Path, replicas: list[Replica]
) -> None:
    """A replica whose every read succeeds, but only after 3,500 one-byte chunks (charged 3.5 MiB of the 4 MiB
    cap, about 0.1 s of the gateway's CPU each): its reads back off as failed ones do, its load is used only
    as long as a light read's would be (then unknown until the next read, never steering by an old reading),
    while an honest replica beside it is read at the interval."""
    buried = b"a" * 3500 + b"\n"
    body = b"".join(b"1\r\n%c\r\n" % c for c in buried) + b"%x\r\n%s\r\n0\r\n\r\n" % (len(GOOD), GOOD)
    replicas += [Replica(CHUNKED + body), Replica(answer(GOOD))]
    routing = "policy: least_outstanding, engine_metrics: true, metrics_interval_ms: 250, metrics_timeout_ms: 250"
    gw = gateway(tmp_path, replicas, routing)
    seen: list[tuple[object, object]] = []
    try:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            shown = status(gw.url)
            seen.append((shown[0]["engine"], shown[0]["engine_error"]))
            time.sleep(0.05)
    finally:
        gw.stop()
    assert ({"waiting": 0.0, "running": 1.0, "kv_usage": None}, None) in seen, seen
    aged = [error for engine, error in seen if engine is None and error is not None]
    assert aged and all(str(e).startswith("the last read was heavy") for e in aged), seen
    heavy, honest = replicas[0].gaps(), replicas[1].gaps()
    assert len(heavy) >= 3 and heavy[2] > 0.8, heavy  # 0.25, 0.5, 1, 2 s: read ever less often
    assert len(honest) >= 12 and statistics.median(honest) < 0.3, honest


async def test_reads_through_a_proxy_and_a_tls_tunnel_are_metered_the_same() -> None:
    ca = trustme.CA()
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("localhost").configure_cert(server_tls)
    client_tls = ssl.create_default_context()
    ca.configure_trust(client_tls)
    good, flood = Replica(answer(b"vllm:num_requests_waiting 2\n")), Replica(b"", INTERIM * 4000)
    tls = Replica(answer(b"vllm:num_requests_waiting 4\n"), tls=server_tls)
    proxy = Proxy()
    await proxy.start()
    connections = pool(client_tls, proxy.url.replace("http://", "http://user:secret@"))
    try:

        async def read(url: str) -> EngineLoad:
            return await read_load(connections, url, VLLM_GAUGES, {}, 5.0, 4 << 20)

        assert await read(good.url.replace("/v1", "/metrics")) == EngineLoad(2.0, 0.0)
        assert await read(f"https://localhost:{tls.server_address[1]}/metrics") == EngineLoad(4.0, 0.0)
        with pytest.raises(Unreadable, match=f"a head larger than {MAX_HEAD} bytes"):
            await read(flood.url.replace("/v1", "/metrics"))
        # Forwarded (plain HTTP) and tunnelled (CONNECT), with the credentials from the proxy's URL.
        assert proxy.lines[0].startswith("GET http://127.0.0.1:") and proxy.lines[1].startswith("CONNECT localhost:")
        assert {h.get("proxy-authorization") for h in proxy.headers} == {"Basic dXNlcjpzZWNyZXQ="}
    finally:
        await connections.aclose()
        await proxy.stop()
        for r in (good, flood, tls):
            r.close()
