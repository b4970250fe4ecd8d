"""Command line: `python -m gateway serve --config PATH` and `python -m gateway check-config PATH`.

A bad config is one line on stderr (`<file>: <yaml path>: <problem>`) and exit status 1.

`serve --server granian` runs the same app factory under Granian instead of uvicorn (docs/servers.md).
A taken port is one line and exit status 1 too; start-up facts are logged at INFO, and at WARNING only
what needs the operator's action (docs/operations.md#start-up-and-logs). `docs` regenerates docs/config.md.
`serve` and `check-config` first read the `.env` beside the config, if any (gateway/ops/envfile.py).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec

from gateway.config import ConfigError, LoadedConfig, load_config, parse_config, read_config, started
from gateway.ops import cores, envfile
from gateway.ops.serving import HTTP_PROTOCOLS, LOG_FORMAT, ListenError, bind, probe, run_uvicorn

log = logging.getLogger("gateway")

APP = "gateway.edge.app:app_from_env"  # an app factory: each worker builds its app from $GATEWAY_CONFIG
SERVERS = ("uvicorn", "granian")
ENV_FILE_HELP = (
    "VAR=value lines to add to the environment before the config is read; variables already set keep "
    "their values (default: the .env in the config file's directory, when there is one)"
)


LOOPBACK = ("127.", "::1", "localhost")


def _announce(loaded: LoadedConfig, host: str | None = None, runtime: tuple[int, bool] | None = None) -> None:
    """Start-up facts an operator must see once, not once per worker.

    WARNING is kept for what needs action; a provider left without its key variable is how the shipped
    config says "not used here", so it is INFO (its requests fail naming the variable anyway).
    """
    from gateway.limits.auth import OPEN_LINE, KeyRing, door
    from gateway.path.routing import Router

    keys = KeyRing(loaded)
    # `runtime`: the ledger's runtime keys not revoked, and whether it ever held one (None: no ledger).
    line = door(loaded.config.keyless, len(loaded.config.keys), *(runtime or (None, False)))
    # Open on loopback is the out-of-the-box `make run`; open on a reachable address needs keys.
    exposed = host is not None and not host.startswith(LOOPBACK)
    log.log(logging.WARNING if line == OPEN_LINE and exposed else logging.INFO, "%s", line)
    for name in keys.disabled:
        log.warning("client key %r is disabled: its key variable is not set", name)
    for reason in Router(loaded).unavailable_providers().values():
        log.info("%s; its requests will fail until it is set", reason)
    admin = loaded.config.admin.key
    if admin and not loaded.missing_for("admin.key"):
        log.info("status page and /admin/* on: GET / asks for admin.key")
    else:
        log.info(
            "status page and /admin/* off (they answer 404): set admin.key (GATEWAY_ADMIN_KEY in the shipped "
            "config.yaml, from the environment or the .env beside it)"
        )


def _read_env_file(args: argparse.Namespace) -> None:
    """`--env-file`, else the `.env` beside the config when there is one (docker compose's project file)."""
    path = Path(args.env_file) if args.env_file is not None else Path(args.config).parent / ".env"
    if args.env_file is None and not path.is_file():
        return
    applied = envfile.load(path)
    # Names only: the values are secrets.
    log.info("read %d variable(s) from %s%s", len(applied), path, f": {', '.join(applied)}" if applied else "")


def _in_process(kind: str) -> bool:
    from providers import REGISTRY
    from providers.base import LocalAdapter

    return issubclass(REGISTRY[kind], LocalAdapter)


def _first_request(loaded: LoadedConfig, host: str, port: int, runtime: tuple[int, bool] | None = None) -> str | None:
    """One request that works now, as a curl line: a model of an in-process provider (it needs no key
    and no server) when the config declares one, else the first model GET /v1/models lists."""
    from gateway.limits.auth import keyless_open
    from gateway.path.routing import Router

    local = [f"{n}/{p.models[0]}" for n, p in loaded.providers.items() if p.models and _in_process(p.kind)]
    listed = [m for m, owner in Router(loaded).model_ids() if owner != "gateway"]
    model = next(iter(local + listed), None)
    if model is None:
        return None
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"  # listening everywhere: loopback is one of the addresses
    elif host == "::":
        host = "::1"
    url = f"http://{f'[{host}]' if ':' in host else host}:{port}/v1/completions"
    live, ever = runtime or (0, False)
    served = keyless_open(loaded.config.keyless, bool(loaded.config.keys), bool(live), ever)
    auth = " -H 'authorization: Bearer <client key>'" if not served else ""
    body = msgspec.json.encode({"model": model, "prompt": "Say hello", "max_tokens": 8}).decode()
    return f"try: curl -s {url} -H 'content-type: application/json'{auth} -d '{body}'"


def _serve(args: argparse.Namespace) -> int:
    if args.server == "granian" and not _granian_installed():
        print(GRANIAN_MISSING, file=sys.stderr)
        return 1
    _read_env_file(args)
    text = read_config(args.config)
    loaded = parse_config(text, args.config)
    runtime = None
    if loaded.config.ledger.url:
        from gateway.ledger.startup import prepare

        runtime = prepare(loaded)  # migrations, and a schema or key-name clash as one line, before any worker starts
    server = loaded.config.server
    host = args.host or server.host
    port = server.port if args.port is None else args.port
    workers = args.workers or server.workers
    # Before anything is announced: a taken port must be the one line the operator sees.
    sock = bind(host, port, workers) if args.server == "uvicorn" else None
    if sock is None:
        probe(host, port)
    else:
        port = sock.getsockname()[1]  # port 0: the one the kernel chose
    _announce(loaded, host, runtime)
    if workers > 1 and not loaded.config.redis.url:
        log.warning("%d workers without redis.url: each worker keeps its own state", workers)
    os.environ[started.PATH_ENV] = os.path.abspath(args.config)
    kept = None
    if workers > 1:
        # What a worker started later falls back to, should the file be broken by then (gateway/config/started.py).
        kept = started.keep(text)
        os.environ[started.KEPT_ENV] = str(kept)
    metrics_dir = None
    if workers > 1 and not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        # Every worker writes its metric values here, so /metrics on any worker reports them all.
        metrics_dir = os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="gateway-metrics-")
    claims = None
    if server.pin_workers:
        # Where each worker claims its core (gateway/ops/cores.py).
        claims = os.environ[cores.CLAIMS_ENV] = cores.claims_dir()
    # Both servers count whole seconds: round up, so the deadline is never shorter than configured.
    grace_s = math.ceil(server.shutdown_grace_ms / 1000)
    try:
        example = _first_request(loaded, host, port, runtime)
        if sock is None:
            _run_granian(host, port, workers, grace_s, example)
            return 0
        log.info("serving on http://%s:%d with %d worker(s) (%s)", host, port, workers, args.server)
        if example:
            log.info("%s", example)
        return run_uvicorn(APP, sock, workers, grace_s, args.http)
    finally:
        if sock is not None:
            sock.close()
        if kept is not None:
            started.forget(kept)
        if metrics_dir is not None:
            # Only a directory this process made: an operator's own PROMETHEUS_MULTIPROC_DIR is theirs.
            shutil.rmtree(metrics_dir, ignore_errors=True)
        if claims is not None:
            shutil.rmtree(claims, ignore_errors=True)


BACKPRESSURE = 65_536
GRANIAN_MISSING = "granian is not installed: pip install 'completions-gateway[granian]'"


def _granian_installed() -> bool:
    try:
        import granian  # noqa: F401
    except ImportError:
        return False
    return True


def _run_granian(host: str, port: int, workers: int, grace_s: int, example: str | None) -> None:
    from granian.constants import HTTPModes, Interfaces, Loops
    from granian.log import LogLevels
    from granian.server.mp import MPServer

    # MPServer rather than `granian.Granian`, which is a server of threads on free-threaded Pythons:
    # worker processes, as under uvicorn, whatever the build.
    class Server(MPServer):
        """Granian's process server, with its answers to a failed bind and to SIGHUP changed."""

        def _init_shared_socket(self) -> None:
            try:
                super()._init_shared_socket()  # type: ignore[no-untyped-call]
            except RuntimeError as exc:
                # Granian's bind error (the port is taken, say) comes from Rust, with a backtrace
                # under RUST_BACKTRACE: one line for the operator, as uvicorn gives.
                reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                raise ListenError(f"cannot listen on {host}:{port}: {reason}") from None
            log.info("serving on http://%s:%d with %d worker(s) (granian)", host, port, workers)
            if example:
                log.info("%s", example)

        def shutdown(self, exit_code: int = 0) -> None:
            # Granian's own lines about it are at INFO, below its log level: the drain is told here.
            log.info(
                "draining: stopped accepting connections; requests and streams in flight have up to %d s "
                "(server.shutdown_grace_ms) to finish",
                grace_s,
            )
            started = time.monotonic()
            super().shutdown(exit_code)  # type: ignore[no-untyped-call]
            log.info("drained in %.1f s; exiting", time.monotonic() - started)

        def signal_handler_reload(self, *args: Any, **kwargs: Any) -> None:
            """Pass SIGHUP on to every worker, which reloads its config in place (gateway/ops/reload.py).

            Granian's own answer respawns every worker: in-process state (usage, limits without Redis)
            is lost, and a worker whose new config does not load exits, which stops the whole server.
            """
            # A forked worker inherits this handler until its Reloader installs its own: only the main
            # process forwards, or a worker would signal its siblings.
            if os.getpid() != self.pid:
                return
            for worker in self.wrks:
                process = worker.inner  # a multiprocessing.Process
                if process.is_alive():
                    with contextlib.suppress(ProcessLookupError):  # it exited just now
                        os.kill(process.pid, signal.SIGHUP)

    Server(
        APP,
        address=host,
        port=port,
        # Lifespan ("asgi", not "asginl"): startup freezes the GC and starts the reloader, shutdown
        # closes the pipeline and flushes the access log.
        interface=Interfaces.ASGI,
        factory=True,
        workers=workers,
        loop=Loops.uvloop,
        http=HTTPModes.http1,
        websockets=False,
        backlog=2048,  # uvicorn's default
        # Granian stops accepting once a worker holds this many open connections, idle keep-alive ones
        # included, and new clients hang unanswered. Its default (backlog / workers) is soon reached by
        # long streams and pooled client connections; uvicorn has no such cap, only the open-file limit.
        backpressure=BACKPRESSURE,
        log_level=LogLevels.warning,
        log_access=False,
        # A worker that dies (OOM-killed, say) is replaced; by default granian would stop the whole server.
        respawn_failed_workers=True,
        # SIGTERM lets each worker finish its open requests; one still running after this is killed.
        workers_kill_timeout=grace_s,
    ).serve()


def _check(args: argparse.Namespace) -> int:
    _read_env_file(args)
    loaded = load_config(args.config, strict=args.strict)
    _announce(loaded)
    print(
        f"{args.config}: ok ({len(loaded.providers)} providers, {len(loaded.config.models)} aliases, "
        f"{len(loaded.config.keys)} keys)"
    )
    return 0


def _docs(args: argparse.Namespace) -> int:
    from gateway.ops import configdoc  # only this command needs it

    return configdoc.main(["--path", args.path, *(["--check"] if args.check else [])])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gateway", description="LLM completions gateway")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser(
        "serve",
        help="run the gateway",
        description="Validate the config, then serve it. Options given here override the config's server: block.",
    )
    serve.add_argument("--config", default="config.yaml", metavar="PATH", help="the YAML config (default: config.yaml)")
    serve.add_argument("--host", help="address to listen on (default: the config's server.host, 127.0.0.1)")
    serve.add_argument(
        "--port", type=int, help="port to listen on, 0: the kernel picks one (default: server.port, 8080)"
    )
    serve.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="worker processes (default: server.workers, 1); without redis.url each keeps its own state",
    )
    serve.add_argument("--env-file", metavar="PATH", help=ENV_FILE_HELP)
    serve.add_argument(
        "--server",
        choices=SERVERS,
        default="uvicorn",
        help="the HTTP server (default: uvicorn; granian needs the granian extra)",
    )
    serve.add_argument(
        "--http",
        choices=HTTP_PROTOCOLS,
        default="gateway",
        help="under uvicorn, the HTTP/1.1 protocol: the gateway's own (default) or uvicorn's httptools one",
    )
    serve.set_defaults(run=_serve)
    check = sub.add_parser("check-config", help="validate a config file and exit")
    check.add_argument("config", metavar="PATH", help="the YAML config to validate as serve would")
    check.add_argument("--env-file", metavar="PATH", help=ENV_FILE_HELP)
    check.add_argument("--strict", action="store_true", help="also fail on unset ${VAR} references")
    check.set_defaults(run=_check)
    docs = sub.add_parser("docs", help="regenerate docs/config.md from the typed config (--check: exit 1 if stale)")
    docs.add_argument("--check", action="store_true", help="exit 1 when the file is stale instead of writing it")
    docs.add_argument("--path", default="docs/config.md", help="the file to write (default: docs/config.md)")
    docs.set_defaults(run=_docs)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    try:
        code: int = args.run(args)
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 1
    except envfile.EnvFileError as exc:
        print(f"env file error: {exc}", file=sys.stderr)
        return 1
    except ListenError as exc:
        print(exc, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    return code


if __name__ == "__main__":
    sys.exit(main())
