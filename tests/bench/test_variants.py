"""The bench's gateway variants: which scenarios measure them, and the command line each is started with.

The server variants are started for real (`bench.runner.serve_argv`, the argv the runner spawns) and told
apart over a raw socket by what only one of the HTTP/1.1 protocols does.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import yaml

from bench import processes
from bench.configs import child_env, gateway_config
from bench.runner import serve_argv
from bench.scenarios import DEFAULT_TARGETS, GRANIAN, HTTPTOOLS, VARIANTS, Settings, build_scenarios


def test_the_httptools_variant_runs_by_default_wherever_granian_does() -> None:
    assert HTTPTOOLS in DEFAULT_TARGETS
    settings = Settings(10, 2, 32, 100, 0, 50, 500, 5000, 500, 30, 3, 1, False, Path("."), Path("."))
    scenarios = build_scenarios(settings)
    with_granian = {s.name for s in scenarios if GRANIAN in s.targets}
    with_httptools = {s.name for s in scenarios if HTTPTOOLS in s.targets}
    assert {"nonstream_c32", "nonstream_c1"} <= with_httptools
    assert with_httptools == with_granian


def _status_with_many_headers(port: int, lines: int) -> bytes:
    """The status line of the answer to a GET /health carrying `lines` extra header lines."""
    extra = "".join(f"x-filler-{i}: {i}\r\n" for i in range(lines))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(f"GET /health HTTP/1.1\r\nhost: bench\r\n{extra}connection: close\r\n\r\n".encode())
        answer = b""
        while b"\r\n" not in answer:
            chunk = sock.recv(4096)
            if not chunk:
                break
            answer += chunk
    return answer.split(b"\r\n", 1)[0]


@pytest.mark.parametrize(("target", "status"), [("gateway", b"HTTP/1.1 431"), (HTTPTOOLS, b"HTTP/1.1 200")])
def test_each_variant_is_served_by_its_own_http_protocol(tmp_path: Path, target: str, status: bytes) -> None:
    # The gateway's own protocol caps a request at 100 header lines (docs/servers.md); uvicorn's has no cap.
    port = processes.free_port()
    config = tmp_path / "gateway.yaml"
    config.write_text(yaml.safe_dump(gateway_config(processes.free_port(), port, None)))
    argv = serve_argv(VARIANTS[target], config, port, workers=1)
    service = processes.start(target, argv, port, tmp_path, timeout=45.0, env=child_env())
    try:
        assert _status_with_many_headers(port, 150).startswith(status)
    finally:
        service.stop()
