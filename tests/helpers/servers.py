"""The gateway on a real socket: `create_app` served by uvicorn in a thread, or the CLI as a child process.

Nothing here stands in for the project's code. `GatewayThread` serves `gateway.edge.app.create_app` with a
real uvicorn (uvloop and gateway.server's HTTP/1.1 protocol, as `python -m gateway serve` runs it) in a
background thread with its own event loop; `GatewayProcess` runs `python -m gateway serve` itself, and
`GatewayChild` optionally as PID 1 of a new PID namespace (`unshare --pid --fork`), as it runs in its
container, where a signal without a handler does not kill it. Everything binds to loopback and is
stopped by whoever started it.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import httpx
import uvicorn

from gateway.config import load_config
from gateway.edge.app import create_app
from gateway.ops.serving import protocol
from gateway.path.pipeline import Pipeline
from tests.helpers.recordings import REPO


class Running:
    """A server that starts on entering a `with` block and stops on leaving it, whatever happened."""

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def stacks() -> str:
    """Every thread's stack and every running event loop's tasks now: what a server that does not stop is
    waiting for."""
    # The tasks first: a truncated report (CI keeps a failure's head and tail) still names what is awaited.
    out = []
    loops = [o for o in gc.get_objects() if isinstance(o, asyncio.AbstractEventLoop) and o.is_running()]
    for loop in loops:
        for task in asyncio.all_tasks(loop):
            frames = "".join(line for f in task.get_stack() for line in traceback.format_stack(f, limit=1))
            out.append(f"--- task {task.get_name()} {task.get_coro()!r}\n{frames}")
    names = {t.ident: t.name for t in threading.enumerate()}
    out += [
        f"--- thread {names.get(ident, ident)}\n" + "".join(traceback.format_stack(frame))
        for ident, frame in sys._current_frames().items()
    ]
    return "\n".join(out)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


# --------------------------------------------------------------------------------------------------
# The gateway


class UvicornThread(Running):
    """An ASGI app served by a real uvicorn (uvloop) on a loopback port, in a background thread with its own
    event loop; `options` are `uvicorn.Config`'s."""

    def __init__(self, app: object, **options: object) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("127.0.0.1", 0))
        self.port = int(self._sock.getsockname()[1])
        config = uvicorn.Config(app, loop="uvloop", **options)  # type: ignore[arg-type]
        config.port = self.port
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self._sock]}, name="test-uvicorn", daemon=True
        )

    def pin_send_buffer(self, size: int) -> int:
        """Fix the kernel's send buffer of the connections accepted from now on (Linux's accepted sockets take it
        from the listening one) in place of the one it grows on its own, up to megabytes: how much of an answer
        can be on its way to a slow client at once. Returns the size the kernel gives (twice `size`)."""
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, size)
        return int(self._sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF))

    def start(self) -> None:
        self._thread.start()
        deadline = time.monotonic() + 15
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.01)

    def stop(self) -> None:
        self.server.should_exit = True
        # Its own shutdown is bounded (2 s of graceful shutdown, then the lifespan's closes, each bounded by a
        # database's or Redis's timeout); a loaded CI machine may still take its time over them.
        self._thread.join(30)
        self._sock.close()
        assert not self._thread.is_alive(), "the server did not stop; where each thread is:\n" + stacks()


class GatewayThread(UvicornThread):
    """`create_app(load_config(path))` served by uvicorn in a thread, like `serve` (uvloop, gateway.server).

    `http="httptools"` serves it with uvicorn's own protocol instead, to compare the two. `poll_every` has the
    gateway look at its config file every `poll_every` seconds from start-up on, its first look included, not
    every 2 s: a test that edits the file then waits for the edit, not for the clock. Edit the file with
    `rewrite`: a poll this often must never find it half written."""

    def __init__(
        self, config_path: Path, env: Mapping[str, str], http: str = "gateway", poll_every: float | None = None
    ) -> None:
        app = self.app = create_app(load_config(config_path, env=dict(env)))
        if poll_every is not None:
            # Startup hooks run once the lifespan has started the reloader, before the server takes requests:
            # restarted, its first sleep is the short one (set after start-up, the 2 s one is already under way).
            async def poll_often(app: Any) -> None:
                reloader = app.state.reloader
                await reloader.stop()
                reloader.interval = poll_every
                reloader.start()

            app.litestar.on_startup.append(poll_often)
        super().__init__(
            app,
            http=protocol(http),
            lifespan="on",
            log_level="warning",
            access_log=False,
            timeout_graceful_shutdown=2,
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pipeline(self) -> Pipeline:
        """The pipeline serving now (a config reload replaces it)."""
        current: Pipeline = self.app.state.pipeline
        return current

    def poll_config_often(self, seconds: float = 0.1) -> None:
        """The gateway's own poll of its config file looks every `seconds` from its next look on, not every 2 s:
        a test that edits the file then waits for the edit, not for the clock (the first look still comes 2 s
        after start-up; `poll_every` makes that one short too). Edit the file with `rewrite`: a poll this often
        must never find it half written."""
        self.app.state.reloader.interval = seconds


def rewrite(path: Path, text: str) -> None:
    """Replace a config file whole (a new file renamed over it). Written in place, a poll between the truncation
    and the write would load the empty file, a valid config of its own (every key and provider gone)."""
    part = path.with_name(path.name + ".part")
    part.write_text(text)
    os.replace(part, path)


@contextlib.contextmanager
def serve_config(
    directory: Path, config: str, env: Mapping[str, str] | None = None, poll_every: float | None = None
) -> Iterator[GatewayThread]:
    """The gateway in a thread serving the YAML text `config`, written to a fresh file in `directory`
    (`poll_every` as for `GatewayThread`)."""
    path = directory / f"gw-{time.monotonic_ns()}.yaml"
    path.write_text(config)
    with GatewayThread(path, dict(env or {}), poll_every=poll_every) as gw:
        yield gw


# --------------------------------------------------------------------------------------------------
# The CLI as a child process


def cli_env(**extra: str) -> dict[str, str]:
    """The environment for `python -m gateway`: no proxies, no provider or Redis variables from outside."""
    drop = ("PROXY", "_API_KEY", "REDIS_URL", "VLLM_BASE_URL", "GATEWAY_CONFIG")
    env = {k: v for k, v in os.environ.items() if not any(d in k.upper() for d in drop)}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def run_cli(
    args: Sequence[str], env: Mapping[str, str] | None = None, timeout: float = 30
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", *args],
        cwd=REPO,
        env=dict(env) if env is not None else cli_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


class GatewayProcess:
    """`python -m gateway serve --config PATH --port N` as a child in its own session."""

    def __init__(
        self,
        config_path: Path,
        env: Mapping[str, str] | None = None,
        *,
        flags: Sequence[str] = (),
        prefix: Sequence[str] = (),
        host: str | None = None,
    ) -> None:
        """`flags`: further `serve` flags (e.g. `--server granian`); `prefix`: a command that runs it (unshare);
        `host`: `--host` (the config's, 127.0.0.1, when None)."""
        self.host = host or "127.0.0.1"
        self.port = free_port(self.host)
        self.log = config_path.with_suffix(".log")
        self._log_file = self.log.open("wb")
        cmd = [sys.executable, "-m", "gateway", "serve", "--config", str(config_path), "--port", str(self.port)]
        if host is not None:
            cmd += ["--host", host]
        self.proc = subprocess.Popen(
            [*prefix, *cmd, *flags],
            cwd=REPO,
            env=dict(env) if env is not None else cli_env(),
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    @property
    def url(self) -> str:
        return f"http://[{self.host}]:{self.port}" if ":" in self.host else f"http://{self.host}:{self.port}"

    def wait_ready(self, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        with httpx.Client(trust_env=False, timeout=1) as client:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"gateway exited with {self.proc.returncode}: {self.log.read_text()}")
                try:
                    if client.get(self.url + "/health").status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                time.sleep(0.05)
        raise RuntimeError(f"gateway did not become ready: {self.log.read_text()}")

    def stop(self) -> None:
        try:
            if self.proc.poll() is None:
                self.proc.terminate()
                try:
                    self.proc.wait(10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(5)
        finally:
            self._log_file.close()


def spawned_workers(main_pid: int) -> list[int]:
    """The worker processes uvicorn spawned from a `serve`'s main process (not multiprocessing's tracker)."""
    children = Path(f"/proc/{main_pid}/task/{main_pid}/children").read_text().split()
    return [pid for pid in map(int, children) if b"multiprocessing.spawn" in Path(f"/proc/{pid}/cmdline").read_bytes()]


def answering_workers(url: str, body: bytes, workers: int, timeout: float = 30) -> set[str]:
    """`body` posted to `url`/v1/completions on new connections until `workers` workers of a `serve` have
    answered (a worker still starting does not listen yet, so the kernel gives it nothing): the workers,
    each by its process's id prefix in `x-request-id` (gateway/ids.py)."""
    seen: set[str] = set()
    deadline = time.monotonic() + timeout
    while len(seen) < workers:
        assert time.monotonic() < deadline, seen
        try:
            with httpx.Client(trust_env=False, timeout=5) as client:
                answer = client.post(
                    f"{url}/v1/completions", content=body, headers={"content-type": "application/json"}
                )
        except httpx.TransportError:
            time.sleep(0.05)  # nobody listens yet
            continue
        assert answer.status_code == 200, answer.text
        seen.add(answer.headers["x-request-id"][4:20])
    return seen


def unshare_pid_works() -> bool:
    """Whether this machine lets us start a process as PID 1 of a new PID namespace."""
    if shutil.which("unshare") is None:
        return False
    try:
        result = subprocess.run(
            [
                "unshare",
                "--pid",
                "--fork",
                "--kill-child=SIGKILL",
                sys.executable,
                "-c",
                "import os; print(os.getpid())",
            ],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0 and result.stdout.strip() == "1"


class GatewayChild(GatewayProcess):
    """`python -m gateway serve --config PATH --port N` in its own session, optionally as PID 1."""

    def __init__(self, config_path: Path, *flags: str, pid1: bool = False, env: dict[str, str] | None = None) -> None:
        # If the test dies, unshare's death takes the gateway with it.
        unshare = ("unshare", "--pid", "--fork", "--kill-child=SIGKILL") if pid1 else ()
        super().__init__(config_path, env, flags=flags, prefix=unshare)
        self.pid1 = pid1
        self.server_pid = self._find_server_pid() if pid1 else self.proc.pid

    def _find_server_pid(self) -> int:
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            pids = children.read_text().split() if children.exists() else []
            if pids:
                return int(pids[0])
            if self.proc.poll() is not None:
                break
            time.sleep(0.01)
        raise RuntimeError(f"unshare started no child: {self.log.read_text()}")

    def sigterm(self) -> None:
        """What `docker stop` does: SIGTERM to the server process (PID 1 in its container)."""
        os.kill(self.server_pid, signal.SIGTERM)

    def stop(self) -> None:
        try:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(10)
        finally:
            self._log_file.close()
