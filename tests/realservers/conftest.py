"""Two real inference servers nobody here wrote, built from PyPI's llama-cpp-python sdist by
tests/realservers/llama_build.sh (cached outside the clone, keyed by version), serving the tiny
random-weight GGUF of tests/realservers/tinygguf.py on loopback ports:

- `llama-server`, llama.cpp's C++ server: its native `/completion`, `/tokenize`, `/detokenize`, `/props`
  and its OpenAI-compatible `/v1/completions`;
- the llama-cpp-python server (`python -m llama_cpp.server`): OpenAI-compatible `/v1/completions`.

Without the build every test here is skipped, saying how to make it. The gateway in front of them has one
provider per way in: `ll` (kind llamacpp -> llama-server), `lv` (kind vllm -> llama-server's /v1) and `py`
(kind vllm -> llama-cpp-python).
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.helpers.servers import GatewayThread, free_port, serve_config

VERSION = "0.3.36"
ROOT = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "completions-gateway" / f"llama-cpp-{VERSION}"
LLAMA_SERVER = ROOT / "build" / "bin" / "llama-server"
PYTHON = ROOT / "venv" / "bin" / "python"
# llama-server's context is small, llama-cpp-python's larger: a prompt between the two is the one that needs
# `context_window_fallbacks` (the GGUF says 2048).
LLAMA_CONTEXT = 256
PYTHON_CONTEXT = 1024
MODEL = "tiny"
STARTUP_S = 120


def _built() -> None:
    if not (ROOT / ".complete").exists():
        pytest.skip(f"llama.cpp servers not built in {ROOT}: run tests/realservers/llama_build.sh (about 10 min)")


class Server:
    def __init__(self, name: str, argv: list[str], port: int, log: Path, env: dict[str, str] | None = None) -> None:
        self.name = name
        self.url = f"http://127.0.0.1:{port}"
        self.log = log
        self._out = log.open("wb")
        self.proc = subprocess.Popen(argv, stdout=self._out, stderr=subprocess.STDOUT, env=env)

    def wait_ready(self, path: str) -> None:
        deadline = time.monotonic() + STARTUP_S
        with httpx.Client(trust_env=False, timeout=5) as client:
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"{self.name} exited: {self.log.read_text()[-2000:]}")
                try:
                    if client.get(self.url + path).status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{self.name} did not start: {self.log.read_text()[-2000:]}")
                time.sleep(0.1)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self._out.close()


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    _built()
    from tests.realservers import tinygguf

    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    tinygguf.write(path)
    return path


@contextmanager
def running_llama_server(model: Path, logs: Path, slots: int = 1, *extra: str) -> Iterator[Server]:
    """A llama-server of the tiny model with `slots` slots (`-np`), each with `LLAMA_CONTEXT` tokens of context."""
    port = free_port()
    argv = [
        str(LLAMA_SERVER),
        *("-m", str(model), "--host", "127.0.0.1", "--port", str(port), *extra),
        *("-c", str(LLAMA_CONTEXT * slots), "-np", str(slots), "-t", "1", "--alias", MODEL, "--no-warmup"),
    ]
    server = Server(f"llama-server -np {slots}", argv, port, logs / f"llama-server-np{slots}.log")
    try:
        server.wait_ready("/health")
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def llama_server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with running_llama_server(tiny_model, tmp_path_factory.mktemp("logs")) as server:
        yield server


@pytest.fixture(scope="session")
def llama_cpp_python(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    port = free_port()
    argv = [
        str(PYTHON),
        *("-m", "llama_cpp.server", "--model", str(tiny_model), "--model_alias", MODEL),
        *("--host", "127.0.0.1", "--port", str(port), "--n_ctx", str(PYTHON_CONTEXT), "--n_threads", "1"),
        *("--verbose", "False"),
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    server = Server("llama-cpp-python", argv, port, tmp_path_factory.mktemp("logs") / "llama-cpp-python.log", env)
    try:
        server.wait_ready("/v1/models")
        yield server
    finally:
        server.stop()


CONFIG = """
server: {{host: 127.0.0.1, port: 0}}
retries: {{attempts: 2}}
providers:
  ll: {{kind: llamacpp, base_url: "{ll}"}}
  lv: {{kind: vllm, base_url: "{ll}/v1"}}
  py: {{kind: vllm, base_url: "{py}/v1"}}
models:
  - name: small
    targets: [{{model: lv/{model}}}]
    context_window_fallbacks: [big]
  - name: big
    targets: [{{model: py/{model}}}]
"""


@pytest.fixture(scope="session")
def gateway(
    llama_server: Server, llama_cpp_python: Server, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayThread]:
    config = CONFIG.format(ll=llama_server.url, py=llama_cpp_python.url, model=MODEL)
    with serve_config(tmp_path_factory.mktemp("gw"), config) as gw:
        yield gw


@pytest.fixture(autouse=True)
def fresh_target_health(request: pytest.FixtureRequest) -> None:
    """A target one test made fail (an empty stream cools it) must not be cooling in the next test."""
    if "gateway" in request.fixturenames:
        gw: GatewayThread = request.getfixturevalue("gateway")
        gw.pipeline.health.reset()


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    with httpx.Client(trust_env=False, timeout=60) as c:
        yield c


__all__ = ["LLAMA_CONTEXT", "MODEL", "PYTHON_CONTEXT", "Server", "running_llama_server"]
