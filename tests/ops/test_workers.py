"""`serve --workers 2` under uvicorn: connections are spread over the workers, over real sockets.

The CLI as a child process, its provider a loopback upstream. Which worker answered is read from the
`x-request-id` every answer carries: `req_`, the worker's process prefix (gateway/ids.py), a counter.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from gateway.ops.serving import own_sockets
from tests.helpers.recordings import REPO
from tests.helpers.servers import GatewayProcess, answering_workers, cli_env, free_port, run_cli, spawned_workers
from tests.helpers.upstreams import Upstream, reply

ANSWER = (
    b'{"id": "c", "object": "text_completion", "created": 1, "model": "m", "choices": [{"index": 0, '
    b'"text": "ok", "finish_reason": "stop"}], '
    b'"usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}'
)
BODY = b'{"model": "up/m", "prompt": "hi", "max_tokens": 1}'
REQUEST = (
    b"POST /v1/completions HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n"
    b"content-length: %d\r\n\r\n%s" % (len(BODY), BODY)
)

pytestmark = pytest.mark.skipif(not own_sockets(2), reason="no SO_REUSEPORT: the workers share one socket")


def _config(tmp_path: Path, upstream: Upstream) -> Path:
    path = tmp_path / "workers.yaml"
    path.write_text(
        "server: {workers: 2}\n"
        "logging: {requests: false}\n"
        f"providers:\n  up: {{kind: vllm, base_url: {upstream.url}/v1, discover: false}}\n"
    )
    return path


def _worker(conn: socket.socket) -> str:
    """One request on `conn`, kept open: the answering worker's id prefix."""
    conn.sendall(REQUEST)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        assert chunk, data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    assert lines[0].startswith("HTTP/1.1 200"), data
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    while len(body) < int(headers["content-length"]):
        body += conn.recv(65536)
    assert "connection" not in headers, headers  # kept alive, as a pooled client's would be
    return headers["x-request-id"][4:20]


def _burst(port: int, n: int = 32) -> Counter[str]:
    """`n` keep-alive connections opened at once (a client pool's), then a request on each: how many each
    worker answered."""
    conns = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(n)]
    try:
        return Counter(_worker(conn) for conn in conns)
    finally:
        for conn in conns:
            conn.close()


def _until_both_answer(url: str) -> set[str]:
    return answering_workers(url, BODY, 2)


def test_a_burst_of_keep_alive_connections_is_spread_over_both_workers(tmp_path: Path) -> None:
    """With one shared socket, the worker that woke first often took all 32 connections (in most bursts
    here, in 1 of 7 of wrk's); with a socket each, the kernel hashes each connection to one of them
    (fewer than 4 of 32 on one side: about 3 bursts in a million)."""
    with Upstream() as upstream:
        upstream.handler = reply(ANSWER)
        gw = GatewayProcess(_config(tmp_path, upstream), cli_env())
        try:
            gw.wait_ready()
            _until_both_answer(gw.url)
            bursts = [_burst(gw.port) for _ in range(12)]
        finally:
            gw.stop()
    assert all(len(burst) == 2 and min(burst.values()) >= 4 for burst in bursts), bursts
    assert len({worker for burst in bursts for worker in burst}) == 2, bursts


def test_a_worker_killed_is_replaced_by_one_with_a_socket_of_its_own(tmp_path: Path) -> None:
    with Upstream() as upstream:
        upstream.handler = reply(ANSWER)
        gw = GatewayProcess(_config(tmp_path, upstream), cli_env())
        try:
            gw.wait_ready()
            before = _until_both_answer(gw.url)
            killed = spawned_workers(gw.proc.pid)[0]
            os.kill(killed, signal.SIGKILL)
            # The survivor alone takes new connections meanwhile, then its new sibling its share.
            after = _until_both_answer(gw.url)
            assert len(before & after) == 1, (before, after)
            assert killed not in spawned_workers(gw.proc.pid)
            burst = _burst(gw.port)
            assert len(burst) == 2 and min(burst.values()) >= 4, burst
        finally:
            gw.stop()


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie left for its new parent to reap has ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("server", ["uvicorn", "granian"])
def test_workers_end_when_their_supervisor_is_killed(tmp_path: Path, server: str) -> None:
    # SIGKILL (the OOM killer's) gives the supervisor no chance to stop its workers: each asked the kernel
    # for SIGTERM when it dies, and drains and exits instead of serving the port on its own forever.
    if server == "granian":
        pytest.importorskip("granian")
    with Upstream() as upstream:
        upstream.handler = reply(ANSWER)
        gw = GatewayProcess(_config(tmp_path, upstream), cli_env(), flags=("--server", server))
        try:
            gw.wait_ready()
            _until_both_answer(gw.url)
            workers = _serving(gw.proc.pid)
            assert len(workers) == 2, workers
            os.kill(gw.proc.pid, signal.SIGKILL)
            gw.proc.wait(5)
            deadline = time.monotonic() + 15
            while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not any(_alive(pid) for pid in workers), (workers, gw.log.read_text()[-2000:])
        finally:
            gw.stop()
            for pid in _still_alive(workers):
                os.kill(pid, signal.SIGKILL)  # a failed run leaves nothing behind


def _serving(main_pid: int) -> list[int]:
    """The main process's children that serve (uvicorn spawns its workers, Granian forks them), without the
    resource tracker multiprocessing starts beside uvicorn's."""
    children = Path(f"/proc/{main_pid}/task/{main_pid}/children").read_text().split()
    return [pid for pid in map(int, children) if b"resource_tracker" not in Path(f"/proc/{pid}/cmdline").read_bytes()]


def _still_alive(pids: list[int]) -> list[int]:
    return [pid for pid in pids if _alive(pid)]


def test_a_taken_port_is_one_line_with_two_workers(tmp_path: Path) -> None:
    config = tmp_path / "workers.yaml"
    config.write_text("server: {workers: 2}\nproviders:\n  demo: {kind: fake}\n")
    # A plain listener, and one with SO_REUSEPORT as another gateway's workers would hold: joining the
    # latter's group would share its connections, so it is refused alike.
    for reuse_port in (False, True):
        with socket.socket() as taken:
            if reuse_port:
                taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            result = run_cli(["serve", "--config", str(config), "--port", str(port)])
        assert (result.returncode, result.stdout) == (1, ""), result.stderr
        assert result.stderr.splitlines() == [f"cannot listen on 127.0.0.1:{port}: Address already in use"]


def test_both_workers_answer_on_ipv6_loopback(tmp_path: Path) -> None:
    try:
        free_port("::1")
    except OSError:
        pytest.skip("no IPv6 loopback")
    with Upstream() as upstream:
        upstream.handler = reply(ANSWER)
        gw = GatewayProcess(_config(tmp_path, upstream), cli_env(), host="::1")
        try:
            _until_both_answer(gw.url)
        finally:
            gw.stop()


def test_a_worker_replaced_while_the_config_is_broken_starts_with_the_one_validated(tmp_path: Path) -> None:
    """A worker started after the operator broke the file mid-edit serves the config `serve` validated (one
    ERROR line says so) instead of failing and being replaced again and again; the validated copy is
    private and goes with the gateway."""
    with Upstream() as upstream:
        upstream.handler = reply(ANSWER)
        path = _config(tmp_path, upstream)
        gw = GatewayProcess(path, cli_env())
        try:
            gw.wait_ready()
            before = _until_both_answer(gw.url)
            # What uvicorn's spawn gave a worker (the main process's own /proc environ is from its exec).
            env = Path(f"/proc/{spawned_workers(gw.proc.pid)[0]}/environ").read_bytes().split(b"\0")
            kept = Path(next(v for v in env if v.startswith(b"GATEWAY_CONFIG_STARTED=")).split(b"=", 1)[1].decode())
            assert kept.read_text() == path.read_text()
            assert (kept.stat().st_mode & 0o777, kept.parent.stat().st_mode & 0o777) == (0o600, 0o700)
            path.write_text("providers: [\n")  # the operator's edit, half saved
            killed = spawned_workers(gw.proc.pid)[0]
            os.kill(killed, signal.SIGKILL)
            after = _until_both_answer(gw.url)
            assert len(before & after) == 1, (before, after)
            time.sleep(1)  # a replacement failing would be replaced again within this
            workers = spawned_workers(gw.proc.pid)
            assert len(workers) == 2 and killed not in workers, workers
        finally:
            gw.stop()
    log = gw.log.read_text()
    assert "Traceback" not in log, log
    problem = f"{path}: line 2, column 1: expected the node content, but found '<stream end>'"
    errors = [line.split(": ", 1)[1] for line in log.splitlines() if " ERROR " in line]
    # The replacement's line once, and (when its poll came round) the survivor's reload keeping its config.
    assert [e for e in errors if e.startswith("config error: ")] == [
        f"config error: {problem}; this worker starts with the config the gateway was started with"
    ], log
    survivor = f"config reload (file changed) failed, keeping the running config: {problem}"
    assert all(e == survivor for e in errors if not e.startswith("config error: ")), log
    assert not kept.parent.exists()


def failing_app() -> object:
    """An app factory (for the test below, in uvicorn's workers) whose app refuses to start."""

    async def app(scope: dict[str, object], receive: object, send: object) -> None:
        assert scope["type"] == "lifespan"
        await receive()  # type: ignore[operator]
        await send({"type": "lifespan.startup.failed", "message": "refused on purpose"})  # type: ignore[operator]

    return app


@pytest.mark.parametrize("workers", [1, 2])
def test_a_worker_that_fails_to_start_stops_the_gateway_with_status_1(workers: int) -> None:
    """Not 0 (nor uvicorn's own 3): a service manager restarting the gateway on failure must see one."""
    code = (
        "import sys; from gateway.ops.serving import bind, run_uvicorn; "
        f"sys.exit(run_uvicorn('tests.ops.test_workers:failing_app', bind('127.0.0.1', 0, {workers}), {workers}, 1))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 1, result.stderr
    assert "refused on purpose" in result.stderr, result.stderr
