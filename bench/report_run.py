"""One bench run as a record: the figures, the machine and tool versions, written as bench/results/*.json."""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import platform
import shutil
import subprocess
from pathlib import Path
from typing import Any

import msgspec

from bench import wrk
from bench.scenarios import Measurement
from bench.upstream import nginx


class RunResult(msgspec.Struct):
    started_at: str
    finished_at: str
    elapsed_s: float
    mode: str
    command: str
    machine: dict[str, str]
    versions: dict[str, str]
    settings: dict[str, Any]
    startup_errors: dict[str, str]
    measurements: list[Measurement]
    # target -> why it was not run (an optional server that is not installed, say).
    skipped: dict[str, str] = msgspec.field(default_factory=dict)


def _run_text(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return (done.stdout + done.stderr).strip()


def describe_machine() -> dict[str, str]:
    model = "unknown"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    free = _run_text(["free", "-m"]).splitlines()
    memory = next((" ".join(line.split()[:2]) + " MiB" for line in free if line.startswith("Mem:")), "unknown")
    return {
        "cpu": model,
        # --all: the bench pins itself to one core, and plain nproc would report that affinity.
        "nproc": _run_text(["nproc", "--all"]) or str(os.cpu_count()),
        "memory": memory.replace("Mem: ", "") + " total",
        "kernel": platform.release(),
        "os": platform.platform(),
    }


def tool_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    binary = nginx.find_nginx()
    versions["nginx"] = _run_text([binary, "-v"]).replace("nginx version: ", "") if binary else "missing"
    versions["wrk"] = wrk.version()
    for dist in (
        "completions-gateway",
        "litestar",
        "aiohttp",
        "msgspec",
        "uvloop",
        "httptools",
        "uvicorn",
        "granian",
        "matplotlib",
    ):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = "missing"
    head = _run_text(["git", "rev-parse", "--short", "HEAD"]) if shutil.which("git") else ""
    versions["git HEAD"] = head if head and " " not in head else "no commit yet"
    return versions


def write_json(result: RunResult, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(msgspec.json.format(msgspec.json.encode(result), indent=2) + b"\n")
