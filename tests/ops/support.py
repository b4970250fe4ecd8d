"""What the operations tests share: the repo's deploy files, and `python -m gateway serve` as a child.

The gateway runs as operators run it: the CLI in a child process on a free loopback port. With
`pid1=True` it runs as PID 1 of a new PID namespace (`unshare --pid --fork`), which is how it runs in
its container (the image's CMD is the process itself, no init), and where a signal without a handler
does not kill it: that changes its exit status after a SIGTERM, so both are tested.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from tests.e2e.harness import GatewayProcess

REPO = Path(__file__).resolve().parents[2]
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


def unshare_pid_works() -> bool:
    """Whether this machine lets us start a process as PID 1 of a new PID namespace."""
    if shutil.which("unshare") is None:
        return False
    try:
        result = subprocess.run(
            [
                "unshare",
                "--pid",
                "--fork",
                "--kill-child=SIGKILL",
                sys.executable,
                "-c",
                "import os; print(os.getpid())",
            ],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0 and result.stdout.strip() == "1"


class GatewayChild(GatewayProcess):
    """`python -m gateway serve --config PATH --port N` in its own session, optionally as PID 1."""

    def __init__(self, config_path: Path, *flags: str, pid1: bool = False, env: dict[str, str] | None = None) -> None:
        # If the test dies, unshare's death takes the gateway with it.
        unshare = ("unshare", "--pid", "--fork", "--kill-child=SIGKILL") if pid1 else ()
        super().__init__(config_path, env, flags=flags, prefix=unshare)
        self.pid1 = pid1
        self.server_pid = self._find_server_pid() if pid1 else self.proc.pid

    def _find_server_pid(self) -> int:
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            pids = children.read_text().split() if children.exists() else []
            if pids:
                return int(pids[0])
            if self.proc.poll() is not None:
                break
            time.sleep(0.01)
        raise RuntimeError(f"unshare started no child: {self.log.read_text()}")

    def sigterm(self) -> None:
        """What `docker stop` does: SIGTERM to the server process (PID 1 in its container)."""
        os.kill(self.server_pid, signal.SIGTERM)

    def stop(self) -> None:
        try:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(10)
        finally:
            self._log_file.close()
