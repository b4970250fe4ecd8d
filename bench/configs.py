"""The bench's gateway config, the YAML fragments merged into it, and the environment its child processes get."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import yaml

from bench import processes


def child_env() -> dict[str, str]:
    # Every hop is loopback; a proxy inherited from the shell would silently add a hop.
    return {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}


def merge(base: dict[str, object], extra: dict[str, object]) -> dict[str, object]:
    merged = dict(base)
    for key, value in extra.items():
        current = merged.get(key)
        if isinstance(current, dict) and isinstance(value, dict):
            merged[key] = merge(current, value)
        else:
            merged[key] = value
    return merged


def gateway_config(
    upstream_port: int,
    gateway_port: int,
    extra: Path | None,
    max_connections: int | None = None,
    transport: str | None = None,
) -> dict[str, object]:
    provider: dict[str, object] = {
        "kind": "openai",
        "base_url": f"http://127.0.0.1:{upstream_port}/v1",
        "api_key": "bench-key",
    }
    if max_connections is not None:
        provider["max_connections"] = max_connections
    if transport is not None:
        provider["transport"] = transport
    config: dict[str, object] = {
        "server": {"host": "127.0.0.1", "port": gateway_port},
        "providers": {"up": provider},
    }
    if extra is not None:
        fragment = yaml.safe_load(extra.read_text()) or {}
        if not isinstance(fragment, dict):
            raise ValueError(f"{extra} must hold a YAML mapping")
        config = merge(config, fragment)
    return config


def start_gateway(config: dict[str, object], work: Path, workers: int = 1) -> processes.Service:
    """The gateway serving `config` (written to `work`/gateway.yaml) on the port it names, with `workers`
    worker processes."""
    server = config["server"]
    assert isinstance(server, dict)
    port = int(server["port"])
    path = work / "gateway.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    argv = [sys.executable, "-m", "gateway", "serve", "--config", str(path)]
    argv += ["--host", "127.0.0.1", "--port", str(port), "--workers", str(workers)]
    return processes.start("gateway", argv, port, work, timeout=45.0)
