"""Shared pieces of the rate-limit suite: a restartable redis-server, configs, requests, header parsing.

Everything is real: `redis-server` on a free loopback port (never 6379), the gateway served by uvicorn
(in a thread via the e2e harness, or as `python -m gateway serve` children), clients over sockets.
"""

from __future__ import annotations

import re
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import redis

from tests.e2e.harness import GatewayThread, free_port

KEY_ENV = "RL_KEY_"


def words(n: int) -> str:
    """A prompt of `n` words that every count agrees on: the fake provider reports `n` prompt tokens
    (whitespace words) and the bytes estimate is ceil((4n - 1) / 4) = n."""
    return " ".join(["abc"] * n)


class RedisProc:
    """A real `redis-server` without persistence on a loopback port that survives restarts."""

    def __init__(self, port: int | None = None) -> None:
        self.port = free_port() if port is None else port
        assert self.port != 6379
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

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

    def start(self) -> None:
        assert self.proc is None or self.proc.poll() is not None, "already running"
        args = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 10
        while not self._pong():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"redis-server did not start on port {self.port}")
            time.sleep(0.01)

    def stop(self) -> None:
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)

    def restart(self) -> None:
        self.stop()
        self.start()

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, decode_responses=True, socket_timeout=5)

    def time_ms(self) -> int:
        """Redis's own clock in whole milliseconds, as the script reads it."""
        with self.client() as r:
            sec, usec = r.time()
            return int(sec) * 1000 + int(usec) // 1000


@contextmanager
def gateway(tmp_path: Path, config: str, env: Mapping[str, str] | None = None) -> Iterator[GatewayThread]:
    """The gateway in a thread (uvicorn, uvloop, httptools) serving `config`."""
    path = tmp_path / f"gw-{time.monotonic_ns()}.yaml"
    path.write_text(config)
    gw = GatewayThread(path, dict(env or {}))
    gw.start()
    try:
        yield gw
    finally:
        gw.stop()


def client(gw_url: str, key: str | None = None, timeout: float = 15) -> httpx.Client:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return httpx.Client(base_url=gw_url, trust_env=False, timeout=timeout, headers=headers)


def body(model: str, prompt_words: int = 3, max_tokens: int = 7, **extra: Any) -> dict[str, Any]:
    return {"model": model, "prompt": words(prompt_words), "max_tokens": max_tokens, **extra}


_DURATION = re.compile(r"^(?:(\d+)m(\d+)s|(\d+(?:\.\d+)?)s|(\d+)ms)$")


def parse_duration(text: str) -> float:
    """OpenAI's reset duration (`20ms`, `1.5s`, `6m0s`) in milliseconds; anything else fails the test."""
    m = _DURATION.match(text)
    assert m is not None, f"not a reset duration: {text!r}"
    if m.group(1) is not None:
        return int(m.group(1)) * 60_000 + int(m.group(2)) * 1000
    if m.group(3) is not None:
        return float(m.group(3)) * 1000
    return float(m.group(4))


def limit_headers(resp: httpx.Response) -> dict[str, str]:
    return {k: v for k, v in resp.headers.items() if k.startswith("x-ratelimit-")}


def wait_until(predicate: Any, timeout: float = 5.0, interval: float = 0.01) -> None:
    """Poll `predicate()` until it is truthy (background settlement is off the request path)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(interval)
