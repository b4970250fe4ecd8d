"""Start-up and logs of `python -m gateway serve`, as an operator sees them: real child processes.

A taken port is one line and exit 1; "serving on" comes once the port is held (and names the port the
kernel chose for port 0); a normal start-up of the shipped config says nothing at WARNING; worker
processes log with the same timestamp and level as the main one; the SIGTERM drain is logged; the
multiprocess metrics directory the gateway made is gone after it exits; `make run PORT=... HOST=...`;
the shipped config's admin key variable turns the status page on.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.helpers.recordings import REPO
from tests.helpers.servers import GatewayProcess, cli_env, free_port, run_cli

# gateway/ops/serving.py's LOG_FORMAT: what every line of the gateway's own logging looks like.
LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) [\w.]+\[(\d+)\]: ")

CONFIG = """
server: {{host: 127.0.0.1, port: {port}, workers: {workers}}}
providers:
  demo: {{kind: fake}}
"""


def _config(tmp_path: Path, port: int = 0, workers: int = 1) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(CONFIG.format(port=port, workers=workers))
    return path


def _log_lines(text: str) -> list[str]:
    # The access log's JSON lines are not `logging` records.
    return [line for line in text.splitlines() if line and not line.startswith("{")]


def _wait_for(path: Path, pattern: str, timeout: float = 20) -> re.Match[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = re.search(pattern, path.read_text())
        if found:
            return found
        time.sleep(0.02)
    raise AssertionError(f"{pattern!r} not in {path.read_text()!r}")


def test_a_taken_port_is_one_line_and_exit_1(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cli(["serve", "--config", str(REPO / "config.yaml"), "--port", str(port)])
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr.splitlines() == [f"cannot listen on 127.0.0.1:{port}: Address already in use"]


def test_serving_on_is_said_once_the_port_is_held_and_names_the_chosen_port(tmp_path: Path) -> None:
    log = tmp_path / "gateway.log"
    with log.open("wb") as out:
        # Port 0 everywhere: the kernel chooses, and only the log can say which.
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve", "--config", str(_config(tmp_path))],
            cwd=REPO,
            env=cli_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        port = int(_wait_for(log, r"serving on http://127\.0\.0\.1:(\d+) with 1 worker\(s\) \(uvicorn\)").group(1))
        assert port != 0
        # Said only once listening: a connection made right away is accepted (it may wait for the app).
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            pass
        deadline = time.monotonic() + 20
        while True:
            try:
                assert httpx.get(f"http://127.0.0.1:{port}/health", trust_env=False).json() == {"status": "ok"}
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.05)
    finally:
        proc.terminate()
        proc.wait(20)


def test_a_normal_start_up_logs_at_info(tmp_path: Path) -> None:
    """The shipped config, no keys set, on loopback: facts at INFO, nothing that asks for action."""
    path = tmp_path / "config.yaml"
    path.write_text((REPO / "config.yaml").read_text())
    # `local` (vLLM) points at a port nobody listens on, as on a laptop without vLLM.
    proc = GatewayProcess(path, cli_env(VLLM_BASE_URL=f"http://127.0.0.1:{free_port()}/v1"))
    try:
        proc.wait_ready()
        _wait_for(proc.log, "model discovery: provider 'local' failed")
    finally:
        proc.stop()
    lines = _log_lines(proc.log.read_text())
    assert lines and all(LINE.match(line) for line in lines), lines
    assert [line for line in lines if " INFO " not in line] == [], lines
    text = "\n".join(lines)
    assert "no client keys configured: the gateway is open to anyone who can reach it" in text
    assert "Provider 'openai' is unavailable: environment variable OPENAI_API_KEY is not set" in text
    assert "status page and /admin/* off" in text


def _wait_exit(proc: subprocess.Popen[bytes], timeout: float = 30) -> int:
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise


def test_workers_log_with_timestamp_and_level_and_the_drain_is_logged(tmp_path: Path) -> None:
    """Two workers: each one's lines look like the main process's, each logs its drain, and the
    metrics directory made for them is gone after exit."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = cli_env(TMPDIR=str(tmp))
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    proc = GatewayProcess(_config(tmp_path, workers=2), env)
    try:
        proc.wait_ready()
        made = [p.name for p in tmp.iterdir() if p.name.startswith("gateway-metrics-")]
        assert len(made) == 1, made  # the directory exists while the gateway runs
        with httpx.Client(base_url=proc.url, trust_env=False, timeout=10) as client:
            for _ in range(4):
                assert client.post("/v1/completions", json={"model": "demo/echo", "prompt": "x"}).status_code == 200
        proc.proc.send_signal(signal.SIGTERM)
        _wait_exit(proc.proc)
    finally:
        proc.stop()
    lines = _log_lines(proc.log.read_text())
    assert all(LINE.match(line) for line in lines), lines
    main_pid = proc.proc.pid
    draining = {m.group(2) for line in lines if "draining: stopped accepting" in line and (m := LINE.match(line))}
    drained = {m.group(2) for line in lines if "drained in" in line and (m := LINE.match(line))}
    assert len(draining) == 2 and str(main_pid) not in draining, lines
    assert drained == draining, lines
    assert any("SIGTERM: stopping the workers" in line for line in lines), lines
    assert not [p for p in tmp.iterdir() if p.name.startswith("gateway-metrics-")]


def test_a_drain_cut_at_the_deadline_is_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(CONFIG.format(port=0, workers=1).replace("workers: 1", "workers: 1, shutdown_grace_ms: 1000"))
    proc = GatewayProcess(path)
    try:
        proc.wait_ready()
        body = {"model": "demo/drip-200ms", "prompt": "x " * 50, "max_tokens": 50, "stream": True}
        with httpx.Client(base_url=proc.url, trust_env=False, timeout=10) as client:
            with client.stream("POST", "/v1/completions", json=body) as response:
                assert response.status_code == 200
                lines = response.iter_lines()
                next(lines)  # the stream is open
                proc.proc.send_signal(signal.SIGTERM)
                seen = list(lines)
        # Cut, and told so: an error event naming the drain deadline, then [DONE] (not a body that just stops).
        events = [line.removeprefix("data: ") for line in seen if line.startswith("data: ")]
        assert events[-1] == "[DONE]", seen
        assert json.loads(events[-2])["error"]["code"] == "shutdown_deadline_exceeded", seen
        assert len(events) < 30, seen  # 50 tokens at 200 ms each would outlast the 1 s deadline
        _wait_exit(proc.proc)
    finally:
        proc.stop()
    text = proc.log.read_text()
    assert re.search(r" INFO gateway\[\d+\]: draining: .* up to 1 s \(server\.shutdown_grace_ms\)", text), text
    assert re.search(r" WARNING gateway\[\d+\]: drain deadline reached \(1 s\): Cancel 1 running task", text), text


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_run_takes_port_and_host(tmp_path: Path) -> None:
    port = free_port()
    bin_dir = Path(sys.executable).parent
    log = tmp_path / "make.log"
    with log.open("wb") as out:
        # `-o`: the venv is whatever runs the tests; make must not install into it.
        proc = subprocess.Popen(
            ["make", "--no-print-directory", "-o", ".venv/.dev", "-o", ".venv/.runtime", "run", f"BIN={bin_dir}"]
            + [f"PORT={port}", "HOST=127.0.0.1", f"CONFIG={_config(tmp_path, port=free_port())}"],
            cwd=REPO,
            env=cli_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        _wait_for(log, rf"serving on http://127\.0\.0\.1:{port} with 1 worker")
        deadline = time.monotonic() + 20
        while True:
            try:
                assert httpx.get(f"http://127.0.0.1:{port}/health", trust_env=False).status_code == 200
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(20)


def test_the_shipped_config_turns_the_status_page_on_with_its_admin_key_variable(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text((REPO / "config.yaml").read_text())
    assert "GATEWAY_ADMIN_KEY=" in (REPO / ".env.example").read_text().splitlines()
    proc = GatewayProcess(path, cli_env(GATEWAY_ADMIN_KEY="operator-secret"))
    try:
        proc.wait_ready()
        with httpx.Client(base_url=proc.url, trust_env=False, timeout=10) as client:
            assert client.get("/").status_code == 200
            assert client.get("/admin/status").status_code == 401
            status = client.get("/admin/status", headers={"authorization": "Bearer operator-secret"})
            assert status.status_code == 200
            assert {p["name"] for p in status.json()["providers"]} >= {"demo", "openai"}
    finally:
        proc.stop()
    assert "status page and /admin/* on" in proc.log.read_text()
    assert "operator-secret" not in proc.log.read_text()


def test_granian_logs_its_drain_too(tmp_path: Path) -> None:
    pytest.importorskip("granian")
    proc = GatewayProcess(_config(tmp_path), flags=("--server", "granian"))
    try:
        proc.wait_ready()
        proc.proc.send_signal(signal.SIGTERM)
        _wait_exit(proc.proc)
    finally:
        proc.stop()
    lines = _log_lines(proc.log.read_text())
    assert any(re.search(r" INFO gateway\[\d+\]: serving on http://127\.0\.0\.1:\d+ .*\(granian\)", x) for x in lines)
    draining = [line for line in lines if "draining: stopped accepting connections" in line]
    assert len(draining) == 1 and LINE.match(draining[0]), lines
    assert any(" INFO gateway[" in line and "drained in" in line for line in lines), lines
