"""How `python -m gateway serve` listens, logs and stops under uvicorn.

The socket is bound in the main process before anything is announced (a taken port is one line and exit
1), and one logging dictConfig is applied in the main process and every worker. Details:
docs/operations.md.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import socket
import time
from typing import Any

from gateway.server import H1Protocol

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s[%(process)d]: %(message)s"


class ListenError(Exception):
    """The server could not open its listening socket."""


def bind(host: str, port: int) -> socket.socket:
    """The listening socket uvicorn would bind (SO_REUSEADDR, inheritable), or a one-line `ListenError`."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family=family)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        # Listening from here on: a client that connects before the workers are up waits in the backlog
        # (uvicorn's size) instead of being refused.
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise ListenError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.set_inheritable(True)
    return sock


def probe(host: str, port: int) -> None:
    """Fail now, in one line, when the port is taken, for servers that bind it themselves later (Granian)."""
    if port:
        bind(host, port).close()


class DrainLog(logging.Filter):
    """uvicorn's records, filtered: WARNING and above pass, and the shutdown story is told at INFO.

    uvicorn says "Shutting down" when a signal stops a worker, "Cancel N running task(s)" when the grace
    period ends with requests still open, and "Finished server process" when the worker is done: those
    become the gateway's own wording; every other INFO line (start-up banners, "Waiting for ...") is dropped.
    """

    def __init__(self, grace_s: int = 30) -> None:
        super().__init__()
        self.grace_s = grace_s
        self._started: float | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.msg if isinstance(record.msg, str) else ""
        if msg == "Shutting down":
            self._started = time.monotonic()
            self._reword(
                record,
                logging.INFO,
                "draining: stopped accepting connections; requests and streams in flight have up to %d s "
                "(server.shutdown_grace_ms) to finish",
                (self.grace_s,),
            )
            return True
        if msg.startswith("Cancel %s running task(s)"):
            # uvicorn's words are kept after the gateway's, for whoever searches logs for them.
            self._reword(
                record,
                logging.WARNING,
                "drain deadline reached (%d s): " + msg + "; raise server.shutdown_grace_ms (and the "
                "orchestrator's grace period) if such requests should finish",
                (self.grace_s, *(record.args if isinstance(record.args, tuple) else ())),
            )
            return True
        if msg.startswith("Finished server process") and self._started is not None:
            self._reword(record, logging.INFO, "drained in %.1f s; exiting", (time.monotonic() - self._started,))
            return True
        if msg.startswith(("Received SIGTERM", "Received SIGINT")):
            # The multi-worker supervisor: each worker then drains and logs its own lines.
            signame = msg.split()[1].rstrip(",")
            self._reword(record, logging.INFO, "%s: stopping the workers, each drains on its own", (signame,))
            return True
        return record.levelno >= logging.WARNING

    @staticmethod
    def _reword(record: logging.LogRecord, level: int, msg: str, args: tuple[Any, ...]) -> None:
        record.msg, record.args = msg, args
        record.levelno, record.levelname = level, logging.getLevelName(level)
        record.name = "gateway"


def log_config(grace_s: int) -> dict[str, Any]:
    """The dictConfig of the main process and of every worker (uvicorn applies it in each)."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"default": {"format": LOG_FORMAT}},
        "filters": {"drain": {"()": DrainLog, "grace_s": grace_s}},
        "handlers": {
            "stderr": {"class": "logging.StreamHandler", "formatter": "default", "stream": "ext://sys.stderr"},
        },
        "root": {"handlers": ["stderr"], "level": "INFO"},
        "loggers": {
            # INFO reaches the filter, which keeps only the shutdown lines of it.
            "uvicorn.error": {"level": "INFO", "filters": ["drain"]},
            "uvicorn.access": {"level": "WARNING"},
            # httpx writes an INFO line per request (a provider on `transport: httpx`): the access log and
            # the gateway's own lines already say what happened, once.
            "httpx": {"level": "WARNING"},
        },
    }


# `serve --http`: the HTTP/1.1 protocol uvicorn runs per connection (docs/servers.md).
HTTP_PROTOCOLS = ("gateway", "httptools")


def protocol(name: str = "gateway") -> type[asyncio.Protocol] | str:
    """What `uvicorn.Config(http=...)` takes for `serve --http NAME`."""
    if name == "httptools":
        return "httptools"  # uvicorn's own, kept to compare against
    return H1Protocol


def run_uvicorn(app: str, sock: socket.socket, workers: int, grace_s: int, http: str = "gateway") -> int:
    """Serve `app` (an app factory's import string) on `sock`; the exit status."""
    import uvicorn
    from uvicorn.supervisors import Multiprocess

    config = uvicorn.Config(
        app,
        factory=True,
        workers=workers,
        loop="uvloop",
        http=protocol(http),
        log_config=log_config(grace_s),
        log_level=None,  # the levels are log_config's
        access_log=False,
        # The gateway never reads client addresses: skip the X-Forwarded-* middleware on every request.
        proxy_headers=False,
        server_header=False,
        timeout_graceful_shutdown=grace_s,
    )
    server = uvicorn.Server(config)
    if workers > 1:
        # uvicorn 0.36 dropped Multiprocess's `target` (each worker builds its own Server from the config).
        if "target" in inspect.signature(Multiprocess).parameters:
            Multiprocess(config, target=server.run, sockets=[sock]).run()  # type: ignore[call-arg]
        else:
            Multiprocess(config, sockets=[sock]).run()
        return 0
    server.run(sockets=[sock])
    # A lifespan start-up failure has been logged by uvicorn already.
    return 0 if server.started else 1
