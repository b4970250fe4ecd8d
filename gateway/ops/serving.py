"""How `python -m gateway serve` listens, logs and stops under uvicorn.

The port is bound in the main process before anything is announced (a taken port is one line and exit
1): the socket the workers share, or, with several workers where SO_REUSEPORT exists, one that holds the
port while each worker listens on a socket of its own. One logging dictConfig is applied in the main
process and every worker. Details: docs/operations.md.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import socket
import sys
import time
from typing import Any

from gateway.server import H1Protocol

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s[%(process)d]: %(message)s"


class ListenError(Exception):
    """The server could not open its listening socket."""


def own_sockets(workers: int) -> bool:
    """Whether each worker listens on a socket of its own (SO_REUSEPORT) rather than on one they share.

    One shared socket is accepted from by whichever worker wakes first, and it takes the whole burst of
    connections waiting (the event loop accepts until none is left): a pool of keep-alive connections
    opened at once may all land on one worker. With a socket each, the kernel spreads new connections
    over the workers by a hash of their addresses. Platforms without SO_REUSEPORT keep the shared one.
    """
    return workers > 1 and hasattr(socket, "SO_REUSEPORT")


def _bound(host: str, port: int, reuse_port: bool) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family=family)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ListenError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


def bind(host: str, port: int, workers: int = 1) -> socket.socket:
    """The main process's socket on the port, or a one-line `ListenError`.

    Shared by the workers (`own_sockets` false): listening (SO_REUSEADDR, inheritable), as uvicorn binds
    it. Otherwise bound with SO_REUSEPORT and not listening: it holds the port for the workers' sockets
    (`WorkerSocket`), and it must not listen, or the kernel would give it a share of the connections
    that no worker ever accepts.
    """
    if own_sockets(workers):
        sock = _bound(host, port, reuse_port=True)
        # SO_REUSEPORT alone would join the listening group of another process of this user on the port (a
        # second gateway started by mistake) and share its connections. A socket without it cannot bind
        # beside any listener, yet can beside this one, which does not listen: a taken port is still caught.
        try:
            _bound(host, sock.getsockname()[1], reuse_port=False).close()
        except ListenError:
            sock.close()
            raise
        return sock
    sock = _bound(host, port, reuse_port=False)
    try:
        # Listening from here on: a client that connects before the workers are up waits in the backlog
        # (uvicorn's size) instead of being refused.
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise ListenError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.set_inheritable(True)
    return sock


class WorkerSocket:
    """What uvicorn hands each worker in place of the main process's socket, when `own_sockets`.

    uvicorn pickles its sockets to every worker it spawns, a replacement for a dead worker included; this
    one travels as the held socket's address and is unpickled in the worker as a socket of the worker's
    own, bound with SO_REUSEPORT. uvicorn starts listening on it once the worker's app is up, so the
    kernel sends a worker no connection before it can answer.
    """

    def __init__(self, held: socket.socket) -> None:
        self.family = held.family
        self.address = held.getsockname()  # IPv6's four fields included: a link-local scope stays

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return _worker_socket, (self.family, self.address)


def _worker_socket(family: socket.AddressFamily, address: tuple[Any, ...]) -> socket.socket:
    sock = socket.socket(family=family)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
    except OSError as exc:
        from uvicorn.config import STARTUP_FAILURE

        # Before uvicorn configures the worker's logging. A start-up failure, so that uvicorn's supervisor
        # stops instead of replacing this worker with one that would fail alike.
        print(f"cannot listen on {address[0]}:{address[1]}: {exc.strerror or exc}", file=sys.stderr)
        sys.exit(STARTUP_FAILURE)
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
    from uvicorn.config import STARTUP_FAILURE
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
        sockets: list[Any] = [WorkerSocket(sock) if own_sockets(workers) else sock]
        # uvicorn 0.36 dropped Multiprocess's `target` (each worker builds its own Server from the config).
        if "target" in inspect.signature(Multiprocess).parameters:
            supervisor = Multiprocess(config, target=server.run, sockets=sockets)  # type: ignore[call-arg]
        else:
            supervisor = Multiprocess(config, sockets=sockets)
        supervisor.run()
        # A worker that failed to start (its app's start-up, its socket) stops them all; the exit status says
        # so, for a service manager that restarts the gateway on failure.
        return 1 if any(p.exitcode == STARTUP_FAILURE for p in supervisor.processes) else 0
    try:
        server.run(sockets=[sock])
    except SystemExit as exc:
        if exc.code != STARTUP_FAILURE:
            raise
    # A lifespan start-up failure has been logged by uvicorn already.
    return 0 if server.started else 1
