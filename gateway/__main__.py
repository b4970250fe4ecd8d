"""Command line: `python -m gateway serve --config PATH` and `python -m gateway check-config PATH`.

A bad config is one line on stderr (`<file>: <yaml path>: <problem>`) and exit status 1.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
import tempfile

from gateway.config import ConfigError, LoadedConfig, load_config

log = logging.getLogger("gateway")


def _announce(loaded: LoadedConfig) -> None:
    """Start-up facts an operator must see once, not once per worker."""
    from gateway.auth import KeyRing
    from gateway.routing import Router

    keys = KeyRing(loaded)
    if keys.open:
        log.warning("no client keys configured: the gateway is open to anyone who can reach it")
    for name in keys.disabled:
        log.warning("client key %r is disabled: its key variable is not set", name)
    for reason in Router(loaded).unavailable_providers().values():
        log.warning("%s; its requests will fail until it is set", reason)


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    loaded = load_config(args.config)
    server = loaded.config.server
    host = args.host or server.host
    port = server.port if args.port is None else args.port
    workers = args.workers or server.workers
    _announce(loaded)
    if workers > 1 and not loaded.config.redis.url:
        log.warning("%d workers without redis.url: each worker keeps its own state", workers)
    os.environ["GATEWAY_CONFIG"] = os.path.abspath(args.config)
    if workers > 1 and not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        # Every worker writes its metric values here, so /metrics on any worker reports them all.
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="gateway-metrics-")
    log.warning("serving on http://%s:%d with %d worker(s)", host, port, workers)
    uvicorn.run(
        "gateway.app:app_from_env",
        factory=True,
        host=host,
        port=port,
        workers=workers,
        loop="uvloop",
        http="httptools",
        log_level="warning",
        access_log=False,
        # The gateway never reads client addresses: skip the X-Forwarded-* middleware on every request.
        proxy_headers=False,
        server_header=False,
        # uvicorn counts whole seconds: round up, so the deadline is never shorter than configured.
        timeout_graceful_shutdown=math.ceil(server.shutdown_grace_ms / 1000),
    )
    return 0


def _check(args: argparse.Namespace) -> int:
    loaded = load_config(args.config, strict=args.strict)
    _announce(loaded)
    print(
        f"{args.config}: ok ({len(loaded.providers)} providers, {len(loaded.config.models)} aliases, "
        f"{len(loaded.config.keys)} keys)"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gateway", description="LLM completions gateway")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the gateway")
    serve.add_argument("--config", default="config.yaml")
    serve.add_argument("--host")
    serve.add_argument("--port", type=int)
    serve.add_argument("--workers", type=int)
    serve.set_defaults(run=_serve)
    check = sub.add_parser("check-config", help="validate a config file and exit")
    check.add_argument("config")
    check.add_argument("--strict", action="store_true", help="also fail on unset ${VAR} references")
    check.set_defaults(run=_check)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        code: int = args.run(args)
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    return code


if __name__ == "__main__":
    sys.exit(main())
