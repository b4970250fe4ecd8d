"""What the operations tests share: the repo's deploy files, read the way Docker and Compose read them.

The gateway itself runs as operators run it, `GatewayChild` in tests/helpers/servers.py: the CLI in a
child process on a free loopback port, optionally as PID 1 of a new PID namespace (how it runs in its
container, where a signal without a handler does not kill it), so both exit statuses are tested.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from tests.helpers.recordings import REPO

DOCKERFILE = REPO / "Dockerfile"
COMPOSE = REPO / "docker-compose.yml"
ENV_EXAMPLE = REPO / ".env.example"
CONFIG = REPO / "config.yaml"

# `${VAR}` and `${VAR:-default}` in config.yaml and docker-compose.yml.
VAR_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?-[^}]*)?\}")


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def dockerfile_instructions(path: Path = DOCKERFILE) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1].strip() + " "
            continue
        line = pending + line
        pending = ""
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    assert not pending, "Dockerfile ends with a continuation line"
    return out


def dockerfile_stages(path: Path = DOCKERFILE) -> list[list[tuple[str, str]]]:
    """The instructions of each stage, FROM first."""
    stages: list[list[tuple[str, str]]] = []
    for ins in dockerfile_instructions(path):
        if ins[0] == "FROM":
            stages.append([])
        assert stages, "instruction before the first FROM"
        stages[-1].append(ins)
    return stages
