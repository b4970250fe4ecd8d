"""The stores the everything-on rows need, started by the bench itself: a redis-server and a PostgreSQL.

Both run on free loopback ports without persistence (Redis) or without fsync (PostgreSQL: a bench's rows
need not survive the machine), in the run's temporary directory, in their own sessions, and are stopped
when the run ends. PostgreSQL is optional: without `initdb` on the machine its rows are skipped with a
note. As root the server runs as the `postgres` user, which PostgreSQL insists on.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.processes import free_port

_START_S = 30.0


def script_calls(commandstats: dict[str, Any]) -> int:
    """The script calls (EVALSHA and EVAL) in a Redis's `INFO commandstats`."""
    return sum(int(commandstats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("evalsha", "eval"))


class Store:
    """A started server: its URL for the gateway's config and how to stop it."""

    def __init__(self, url: str, proc: subprocess.Popen[bytes], home: Path | None = None) -> None:
        self.url = url
        self.proc = proc
        self.home = home

    def stop(self) -> None:
        if self.proc.poll() is None:
            # SIGINT is PostgreSQL's fast shutdown; redis-server exits on it too. It goes to the server's whole
            # process group (its own session): as root, `runuser` stands between us and postgres and does not pass
            # SIGINT on, so signalling only the process we started would leave postgres running.
            self._signal(signal.SIGINT)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                self.proc.wait(5)
        if self.home is not None:
            shutil.rmtree(self.home, ignore_errors=True)

    def _signal(self, sig: signal.Signals) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass


def _redis_pong(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def start_redis(wrapper: Sequence[str] = ()) -> Store:
    """`wrapper`: a command the server runs under (`valgrind --tool=callgrind ...`), its arguments before
    redis-server's."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server not found (apt-get install -y redis-server)")
    port = free_port()
    argv = [*wrapper, binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + _START_S
    while not _redis_pong(port):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            proc.wait(5)
            raise RuntimeError(f"redis-server did not start on port {port}")
        time.sleep(0.02)
    return Store(f"redis://127.0.0.1:{port}/0", proc)


def _pg_bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    if found:
        return Path(found[-1]).parent
    on_path = shutil.which("initdb")
    return Path(on_path).parent if on_path else None


def start_postgres() -> Store:
    bin_dir = _pg_bin()
    if bin_dir is None:
        raise RuntimeError("PostgreSQL is not installed (initdb not found)")
    as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    # Its own directory: the run's is private to this user, and the server may run as another.
    home = Path(tempfile.mkdtemp(prefix="bench-pg-"))
    home.chmod(0o755)
    if os.geteuid() == 0:
        shutil.chown(home, "postgres")
    data, port = home / "data", free_port()
    subprocess.run(
        [*as_user, str(bin_dir / "initdb"), "-D", str(data), "-A", "trust", "-U", "gw", "--no-sync", "-E", "UTF8"],
        check=True,
        capture_output=True,
        timeout=_START_S,
    )
    argv = [*as_user, str(bin_dir / "postgres"), "-D", str(data), "-p", str(port), "-k", str(home)]
    argv += ["-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "synchronous_commit=off"]
    log = (home / "server.log").open("ab")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    log.close()
    deadline = time.monotonic() + _START_S
    ready = [str(bin_dir / "pg_isready"), "-h", "127.0.0.1", "-p", str(port), "-U", "gw", "-d", "postgres"]
    while subprocess.run(ready, capture_output=True, timeout=10, check=False).returncode != 0:
        if proc.poll() is not None or time.monotonic() > deadline:
            Store("", proc, home).stop()
            raise RuntimeError(f"postgres did not start: {(home / 'server.log').read_text()[-500:]}")
        time.sleep(0.1)
    return Store(f"postgresql://gw@127.0.0.1:{port}/postgres", proc, home)
