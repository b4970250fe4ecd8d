"""The deploy files keep the properties docs/deploy.md promises; a regression fails here, not in production.

Dockerfile: slim base, the package installed without dev extras, a non-root user, port 8080, a /ready
healthcheck, the CLI as CMD. docker-compose.yml: shared Redis without persistence, read-only config,
`.env`, healthchecks, a stop grace longer than the gateway's drain, and replicas that can scale (no
host port on the gateway; nginx publishes one port for all of them). `.env.example` lists every
variable the config uses. The healthcheck one-liner itself is run against a live gateway. When
`docker-compose` (or `docker compose`) is installed, the file is also validated by it, offline.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.config import load_config
from tests.helpers.recordings import REPO
from tests.helpers.servers import GatewayChild, cli_env, free_port

from .conftest import (
    COMPOSE,
    CONFIG,
    DOCKERFILE,
    ENV_EXAMPLE,
    VAR_REF,
    dockerfile_instructions,
    dockerfile_stages,
    load_yaml,
)

CMD = [
    "python",
    "-m",
    "gateway",
    "serve",
    "--config",
    "/etc/gateway/config.yaml",
    "--host",
    "0.0.0.0",
    "--port",
    "8080",
]
CONFIG_IN_IMAGE = "/etc/gateway/config.yaml"


def _compose() -> dict[str, Any]:
    data = load_yaml(COMPOSE)
    assert isinstance(data, dict)
    return data


def _service(name: str) -> dict[str, Any]:
    service = _compose()["services"][name]
    assert isinstance(service, dict)
    return service


def _duration_s(text: str) -> float:
    """A compose duration (`40s`, `1m30s`, `500ms`) in seconds."""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001, "us": 1e-6}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|us|h|m|s)", text)
    assert parts and "".join(n + u for n, u in parts) == text, f"not a duration: {text!r}"
    return sum(float(n) * units[u] for n, u in parts)


def _environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):
        return dict(item.split("=", 1) for item in env)
    assert isinstance(env, dict)
    return {str(k): str(v) for k, v in env.items()}


def _healthcheck_code(test: list[str]) -> str:
    assert test[:3] == ["CMD", "python", "-c"], test
    assert len(test) == 4
    return test[3]


def _dockerfile_healthcheck() -> list[str]:
    (hc,) = [args for word, args in dockerfile_instructions() if word == "HEALTHCHECK"]
    options, _, command = hc.partition("CMD ")
    assert "--interval=" in options and "--timeout=" in options
    parsed = json.loads(command)  # the exec (JSON) form
    assert isinstance(parsed, list)
    return ["CMD", *parsed]


# --------------------------------------------------------------------------------------------------
# Dockerfile


def test_dockerfile_slim_package_install_non_root_port_healthcheck_cmd() -> None:
    stages = dockerfile_stages()
    for stage in stages:
        assert stage[0][1].split()[0] == "python:3.11-slim", stage[0]
    build, final = stages[0], stages[-1]

    runs = " ".join(args for word, args in build if word == "RUN")
    assert "pip install --no-cache-dir ." in runs
    assert "[dev]" not in DOCKERFILE.read_text()
    assert "curl" not in runs and "apt-get" not in runs

    words = [word for word, _ in final]
    users = [args for word, args in final if word == "USER"]
    assert users, "the runtime stage has no USER"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0"), users
    # USER comes after everything that needs root, and nothing runs after it.
    assert "RUN" not in words[words.index("USER") :]

    assert ("EXPOSE", "8080") in final
    (cmd,) = [args for word, args in final if word == "CMD"]
    assert json.loads(cmd) == CMD
    assert ("COPY", f"config.yaml {CONFIG_IN_IMAGE}") in final
    assert "/ready" in _healthcheck_code(_dockerfile_healthcheck())


def test_dockerignore_keeps_secrets_and_clutter_out_but_not_what_the_build_copies() -> None:
    patterns = [
        line.strip() for line in (REPO / ".dockerignore").read_text().splitlines() if line.strip() and line[0] != "#"
    ]
    for required in (".git/", ".venv/", ".env", ".pytest_cache/", ".mypy_cache/", ".ruff_cache/", "bench/results/"):
        assert required in patterns, required
    excluded = [p.rstrip("/") for p in patterns if not p.startswith("!")]
    copied = []
    for word, args in dockerfile_instructions():
        if word == "COPY" and "--from=" not in args:
            copied += args.split()[:-1]
    assert copied
    for source in copied:
        source = source.rstrip("/")
        hits = [p for p in excluded if fnmatch.fnmatch(source, p) or source.startswith(p + "/")]
        assert not hits, f"{source} is copied by the Dockerfile but excluded by {hits}"


# --------------------------------------------------------------------------------------------------
# docker-compose.yml


def test_compose_gateway_service() -> None:
    gateway = _service("gateway")
    assert gateway["build"] == "."
    env_file = gateway["env_file"]
    assert ".env" in ([env_file] if isinstance(env_file, str) else env_file)
    assert _environment(gateway)["REDIS_URL"] == "redis://redis:6379/0"
    assert gateway["depends_on"]["redis"]["condition"] == "service_healthy"
    assert gateway["restart"] == "unless-stopped"

    mounts = []
    for volume in gateway["volumes"]:
        if isinstance(volume, str):
            source, target, *mode = volume.split(":")
            mounts.append((source, target, mode == ["ro"]))
        else:
            mounts.append((volume["source"], volume["target"], bool(volume.get("read_only"))))
    assert ("./config.yaml", CONFIG_IN_IMAGE, True) in mounts

    check = gateway["healthcheck"]
    assert "/ready" in _healthcheck_code(check["test"])
    assert _healthcheck_code(check["test"]) == _healthcheck_code(_dockerfile_healthcheck())

    # Scaling: a fixed host port on the gateway would collide between replicas; nginx publishes it.
    assert "ports" not in gateway
    assert gateway["expose"] == ["8080"]


def test_compose_stop_grace_outlasts_the_gateway_drain() -> None:
    grace_s = load_config(CONFIG).config.server.shutdown_grace_ms / 1000
    for name in ("gateway", "proxy"):
        # Drain deadline, then the app's own shutdown: Docker must not SIGKILL before both are done.
        assert _duration_s(_service(name)["stop_grace_period"]) >= grace_s + 5, name


def test_compose_redis_without_persistence_and_with_a_healthcheck() -> None:
    redis = _service("redis")
    assert redis["image"] == "redis:7-alpine"
    command = redis["command"]
    argv = shlex.split(command) if isinstance(command, str) else command
    assert argv[0] == "redis-server"
    assert argv[argv.index("--save") + 1] == ""
    assert argv[argv.index("--appendonly") + 1] == "no"
    assert redis["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"]
    assert "ports" not in redis


def _nginx_conf() -> str:
    """The nginx config the proxy service writes at start, with compose's `$$` unescaped."""
    script = _service("proxy")["command"][-1]
    match = re.search(r"<<'EOF'\n(.*?)\nEOF\n", script, re.S)
    assert match, script
    return str(match.group(1)).replace("$$", "$")


def test_compose_proxy_publishes_one_port_for_every_replica() -> None:
    proxy = _service("proxy")
    assert proxy["ports"] == ["${GATEWAY_PORT:-8080}:8080"]
    assert proxy["depends_on"]["gateway"]["condition"] == "service_healthy"
    assert proxy["restart"] == "unless-stopped"
    conf = _nginx_conf()
    # Re-resolved through Docker's DNS, so every replica (and later ones) gets traffic.
    assert re.search(r"resolver 127\.0\.0\.11 valid=\d+s", conf)
    assert "set $gateway http://gateway:8080;" in conf and "proxy_pass $gateway;" in conf
    # Streams are relayed as they come, and nothing times out before the gateway's own deadlines.
    assert "proxy_buffering off;" in conf
    timeouts = load_config(CONFIG).config.timeouts
    read_timeout = re.search(r"proxy_read_timeout (\d+)s;", conf)
    assert read_timeout and int(read_timeout.group(1)) * 1000 > timeouts.total_ms
    body = re.search(r"client_max_body_size (\d+)m;", conf)
    assert body and int(body.group(1)) >= 8


# --------------------------------------------------------------------------------------------------
# .env.example and .gitignore


def _env_example() -> dict[str, str]:
    out: dict[str, str] = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        assert re.fullmatch(r"[A-Z_][A-Z0-9_]*=[^\s\"']*", line), f"not VAR=value: {line!r}"
        name, _, value = line.partition("=")
        out[name] = value
    return out


def test_env_example_lists_every_variable_of_config_and_compose() -> None:
    listed = _env_example()
    # Commented-out entries count (the `keys:` example); `${VAR}` in prose is no variable.
    referenced = set(VAR_REF.findall(CONFIG.read_text())) | set(VAR_REF.findall(COMPOSE.read_text()))
    referenced.discard("VAR")
    assert referenced <= set(listed), sorted(referenced - set(listed))
    for name in ("OPENAI_API_KEY", "FIREWORKS_API_KEY", "TOGETHER_API_KEY", "DEEPSEEK_API_KEY", "SEARCH_TEAM_KEY"):
        assert listed[name] == "", f"{name} must not carry a value in the committed example"


def test_dot_env_is_ignored_by_git() -> None:
    assert ".env" in (REPO / ".gitignore").read_text().splitlines()
    result = subprocess.run(
        ["git", "check-ignore", "-q", ".env"], cwd=REPO, capture_output=True, timeout=10, check=False
    )
    assert result.returncode == 0, "git does not ignore .env"


# --------------------------------------------------------------------------------------------------
# The healthcheck one-liner, run for real


@pytest.fixture
def healthcheck_code() -> str:
    return _healthcheck_code(_dockerfile_healthcheck())


def _run_healthcheck(code: str, port: int) -> int:
    assert "127.0.0.1:8080" in code
    result = subprocess.run(
        [sys.executable, "-c", code.replace("127.0.0.1:8080", f"127.0.0.1:{port}")],
        # A proxy in the environment must not divert the check (the code disables proxies).
        env=cli_env(HTTP_PROXY="http://127.0.0.1:9", http_proxy="http://127.0.0.1:9"),
        capture_output=True,
        timeout=10,
        check=False,
    )
    return result.returncode


@pytest.fixture
def gateways(tmp_path: Path) -> Iterator[tuple[GatewayChild, GatewayChild]]:
    ready_cfg = tmp_path / "ready.yaml"
    ready_cfg.write_text("providers: {demo: {kind: fake}}\n")
    # Redis configured but nothing listening: /ready answers 503.
    degraded_cfg = tmp_path / "degraded.yaml"
    degraded_cfg.write_text(
        f"redis: {{url: 'redis://127.0.0.1:{free_port()}/0'}}\nproviders: {{demo: {{kind: fake}}}}\n"
    )
    ready, degraded = GatewayChild(ready_cfg), GatewayChild(degraded_cfg)
    try:
        ready.wait_ready()
        degraded.wait_ready()
        yield ready, degraded
    finally:
        ready.stop()
        degraded.stop()


@pytest.mark.timeout(60)
def test_the_healthcheck_command_follows_ready(healthcheck_code: str, gateways: tuple[GatewayChild, ...]) -> None:
    ready, degraded = gateways
    assert _run_healthcheck(healthcheck_code, ready.port) == 0
    assert _run_healthcheck(healthcheck_code, degraded.port) == 1
    assert _run_healthcheck(healthcheck_code, free_port()) == 1  # nothing listening


# --------------------------------------------------------------------------------------------------
# docker-compose's own validation (no engine needed)


def _compose_command() -> list[str] | None:
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    if shutil.which("docker"):
        probe = subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=20, check=False)
        if probe.returncode == 0:
            return ["docker", "compose"]
    return None


@pytest.mark.timeout(60)
@pytest.mark.parametrize("port", [None, "9191"])
def test_docker_compose_config_accepts_the_file(tmp_path: Path, port: str | None) -> None:
    command = _compose_command()
    if command is None:
        if os.environ.get("CI") and os.geteuid() == 0:
            pytest.fail("docker-compose is missing although .ci/run, as root, installs it")
        pytest.skip("neither docker-compose nor `docker compose` is installed (.ci/run installs docker-compose)")
    shutil.copy(COMPOSE, tmp_path / "docker-compose.yml")
    shutil.copy(CONFIG, tmp_path / "config.yaml")
    env = ENV_EXAMPLE.read_text()
    if port is not None:
        env = re.sub(r"(?m)^GATEWAY_PORT=.*$", f"GATEWAY_PORT={port}", env)
    # The operator's .env, made from the committed example.
    (tmp_path / ".env").write_text(env)
    result = subprocess.run(
        [*command, "--project-directory", str(tmp_path), "-f", str(tmp_path / "docker-compose.yml"), "config"],
        cwd=tmp_path,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=50,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    resolved = yaml.safe_load(result.stdout)
    services = resolved["services"]
    assert set(services) == {"gateway", "proxy", "redis"}
    (published,) = services["proxy"]["ports"]
    assert str(published["published"]) == (port or "8080") and int(published["target"]) == 8080
    assert services["gateway"]["environment"]["REDIS_URL"] == "redis://redis:6379/0"
