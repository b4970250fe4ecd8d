"""A real `redis-server` on a free loopback port (never 6379), without persistence, restartable in place."""

from __future__ import annotations

import socket
import subprocess
import time
from types import TracebackType

import redis

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
