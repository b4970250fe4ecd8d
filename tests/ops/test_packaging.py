"""The image's Python packaging, checked without Docker: the wheel the Dockerfile's `pip install .` builds.

The build stage of the Dockerfile copies a few paths into /src and runs `pip install .` there. This test
copies exactly those paths (read from the Dockerfile's COPY lines) into a temporary directory, builds the
wheel from it the same way (pip, isolated build: the build backend comes from PyPI), installs the wheel
with `--no-deps` into a fresh target directory, and runs the CLI from there, outside the repo, on the
dependencies of this venv. A module left out of the package, a file the build needs but the Dockerfile
does not copy, or a runtime dependency dropped from pyproject.toml fails here.
"""

from __future__ import annotations

import email.parser
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.helpers.recordings import REPO
from tests.helpers.servers import cli_env

from .conftest import CONFIG, dockerfile_stages

# What `python -m gateway serve` needs at run time, beyond the pure-Python web stack.
RUNTIME_REQUIREMENTS = {"litestar", "msgspec", "yarl", "uvicorn", "uvloop", "httptools", "hiredis", "pyyaml", "redis"}
DEV_ONLY = {"pytest", "mypy", "ruff", "openai", "aiohttp"}

IMPORT_ALL = """
import importlib, pkgutil, sys
for name in ("gateway", "providers", "wire"):
    package = importlib.import_module(name)
    assert package.__file__.startswith(sys.argv[1]), (name, package.__file__)
    for module in pkgutil.walk_packages(package.__path__, name + "."):
        importlib.import_module(module.name)
import gateway.edge.app, uvloop, httptools
print("imported")
"""


def _copy_build_context(dest: Path) -> None:
    """The build stage's `COPY src... dst` lines, applied to `dest` as the WORKDIR."""
    build = dockerfile_stages()[0]
    copies = [args.split() for word, args in build if word == "COPY"]
    assert copies
    for *sources, target in copies:
        for source in sources:
            src = REPO / source
            if src.is_dir():
                shutil.copytree(src, dest / target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            else:
                (dest / target).mkdir(parents=True, exist_ok=True)
                shutil.copy(src, dest / target / src.name)


def _pip(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "pip", *args],
        env=cli_env(PIP_DISABLE_PIP_VERSION_CHECK="1"),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result


@pytest.fixture(scope="module")
def build_context(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("packaging") / "src"
    src.mkdir()
    _copy_build_context(src)
    return src


@pytest.fixture(scope="module")
def wheel(build_context: Path) -> Path:
    dist = build_context.parent / "dist"
    _pip("wheel", "--no-deps", "--quiet", "--wheel-dir", str(dist), str(build_context), timeout=120)
    (built,) = dist.glob("completions_gateway-*.whl")
    return built


def test_the_wheel_holds_every_module_and_no_tests(build_context: Path, wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    # Every module of the packages as the Dockerfile copies them (the copy, not the live tree: the
    # wheel was built from it).
    expected = {
        path.relative_to(build_context).as_posix()
        for package in ("gateway", "providers", "wire")
        for path in (build_context / package).rglob("*.py")
    }
    assert "gateway/edge/app.py" in expected and "providers/base.py" in expected
    assert expected <= names, sorted(expected - names)
    assert "gateway/__main__.py" in names
    assert not any(n.startswith(("tests/", "bench/")) for n in names)


def test_the_wheel_requires_the_runtime_stack_and_no_dev_tools(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        (metadata_name,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = email.parser.Parser().parsestr(zf.read(metadata_name).decode())
    unconditional: set[str] = set()
    for requirement in metadata.get_all("Requires-Dist") or []:
        name = requirement.split(";")[0].split("[")[0].split("<")[0].split(">")[0].split("=")[0].strip().lower()
        if "extra ==" not in requirement:
            unconditional.add(name)
    assert RUNTIME_REQUIREMENTS <= unconditional, sorted(RUNTIME_REQUIREMENTS - unconditional)
    assert not DEV_ONLY & unconditional, sorted(DEV_ONLY & unconditional)


@pytest.mark.timeout(90)
def test_the_installed_wheel_imports_and_runs_the_cli_outside_the_repo(wheel: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    _pip("install", "--no-deps", "--no-index", "--quiet", "--target", str(site), str(wheel), timeout=60)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = cli_env(PYTHONPATH=str(site))

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        # -P: the working directory is not on sys.path; only the installed wheel provides the packages.
        return subprocess.run(
            [sys.executable, "-P", *args], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=60
        )

    imported = run("-c", IMPORT_ALL, str(site))
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout.strip() == "imported"

    shipped = elsewhere / "config.yaml"
    shutil.copy(CONFIG, shipped)
    checked = run("-m", "gateway", "check-config", str(shipped))
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout.startswith(f"{shipped}: ok (")
