"""A real PostgreSQL server for the tests, started by the suite itself (Debian's `postgresql` package).

`initdb` into a temporary directory, then `postgres` on a free loopback port with its socket in that
directory, trust authentication for the one superuser `gw`, and no fsync (a test's data need not survive
the machine). PostgreSQL refuses to run as root: as root the server runs as the `postgres` user
(`runuser`), which owns the directory. Started in its own session and stopped (fast shutdown, then
kill) even when the test fails; `stop` / `start` keep the data and the port, for outage tests.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

from tests.helpers.servers import free_port

USER = "gw"
_START_S = 30.0


def binaries() -> Path | None:
    """Debian's versioned bin directory (the newest), or wherever `initdb` is on PATH; None without either."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    if found:
        return Path(found[-1]).parent
    on_path = shutil.which("initdb")
    return Path(on_path).parent if on_path else None


def _as_server_user() -> list[str]:
    return ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []


class PostgresServer:
    def __init__(self, port: int | None = None) -> None:
        bin_dir = binaries()
        if bin_dir is None:
            raise RuntimeError("PostgreSQL is not installed (Debian: apt-get install postgresql; .ci/run does)")
        self.bin = bin_dir
        self.port = free_port() if port is None else port
        self.dir = Path(tempfile.mkdtemp(prefix="gateway-pg-"))
        self.dir.chmod(0o755)
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres")
        self.data = self.dir / "data"
        self.dbname = "postgres"
        self._databases = 0
        subprocess.run(
            [*_as_server_user(), str(self.bin / "initdb"), "-D", str(self.data), "-A", "trust", "-U", USER]
            + ["--no-sync", "-E", "UTF8"],
            check=True,
            capture_output=True,
            timeout=_START_S,
        )
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def dsn(self, dbname: str | None = None) -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{dbname or self.dbname}"

    @property
    def url(self) -> str:
        """The URL of the current test's database."""
        return self.dsn()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        assert not self.running, "already running"
        argv = [*_as_server_user(), str(self.bin / "postgres"), "-D", str(self.data), "-p", str(self.port)]
        argv += ["-k", str(self.dir), "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off"]
        argv += ["-c", "synchronous_commit=off", "-c", "full_page_writes=off", "-c", "max_connections=50"]
        log = (self.dir / "server.log").open("ab")
        self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        deadline = time.monotonic() + _START_S
        while not self._ready():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"postgres did not start: {(self.dir / 'server.log').read_text()[-2000:]}")
            time.sleep(0.05)

    def _ready(self) -> bool:
        result = subprocess.run(
            [str(self.bin / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port), "-U", USER, "-d", "postgres"],
            capture_output=True,
            timeout=10,
            check=False,
        )
        return result.returncode == 0

    def stop(self) -> None:
        """A fast shutdown (SIGINT to the postmaster): clients are cut off, as when a database goes away."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            pidfile = self.data / "postmaster.pid"
            try:
                os.kill(int(pidfile.read_text().split()[0]), signal.SIGINT)
            except (OSError, ValueError, IndexError):
                proc.terminate()  # SIGTERM would be a "smart" shutdown, waiting for every client to leave
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)

    def fresh_database(self) -> str:
        """A new empty database, made the one `url` names."""
        import psycopg

        self._databases += 1
        name = f"t{self._databases}"
        with psycopg.connect(self.dsn("postgres"), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        self.dbname = name
        return name

    def __enter__(self) -> PostgresServer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
