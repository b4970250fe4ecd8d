"""pyproject.toml declares what runs: its runtime dependencies are exactly what gateway/, providers/ and wire/ import.

Both directions, read from the source (ast) and from the installed distributions' metadata (which maps a
distribution to its import names, e.g. google-re2 -> re2, PyYAML -> yaml):
- every `[project] dependencies` entry is imported somewhere in gateway/, providers/ or wire/, unless IMPLICIT
  says who loads it without an import statement;
- every third-party module imported there is a runtime dependency, or belongs to an optional extra (an
  import guarded for when the extra is missing), never only to `dev`: a transitive dependency imported
  directly must be declared, or an upgrade of its parent can remove it.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Final

REPO: Final = Path(__file__).resolve().parents[2]
PACKAGES: Final = ("gateway", "providers", "wire")

# Runtime dependencies loaded by another package rather than by an import in ours:
# distribution -> (a file of ours that selects it, the text that does), or None when nothing names it.
IMPLICIT: Final[dict[str, tuple[str, str] | None]] = {
    # uvicorn imports the event loop `serve` asks for by name.
    "uvloop": ("gateway/ops/serving.py", 'loop="uvloop"'),
    # redis-py parses replies with it whenever it is installed (gateway/limits/scriptchannel.py also imports it).
    "hiredis": None,
}


def _name(requirement: str) -> str:
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
    assert match, requirement
    return re.sub(r"[-_.]+", "-", match.group(0)).lower()


def _project() -> dict[str, list[str]]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras: dict[str, list[str]] = project.get("optional-dependencies", {})
    return {"": project["dependencies"], **extras}


def _imports() -> set[str]:
    found: set[str] = set()
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    found.update(alias.name.split(".")[0] for alias in node.names)
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    found.add(node.module.split(".")[0])
    return {n for n in found if n not in sys.stdlib_module_names and n not in (*PACKAGES, "__future__")}


@cache
def _installed() -> Mapping[str, list[str]]:
    return importlib.metadata.packages_distributions()


def _distributions_of(module: str) -> set[str]:
    return {_name(d) for d in _installed().get(module, [])}


def test_every_runtime_dependency_is_imported_or_explained() -> None:
    imported = {dist for module in _imports() for dist in _distributions_of(module)}
    runtime = [_name(r) for r in _project()[""]]
    unused = [d for d in runtime if d not in imported and d not in IMPLICIT]
    assert unused == [], f"runtime dependencies nothing in {PACKAGES} imports: move them to an extra"
    for dist, where in IMPLICIT.items():
        assert dist in runtime, f"{dist} is listed as implicit but is not a runtime dependency"
        if where is not None:
            path, text = where
            assert text in (REPO / path).read_text(), f"{path} no longer selects {dist}: is it still needed?"


def test_every_third_party_import_is_declared_for_run_time() -> None:
    project = _project()
    declared = {_name(r) for group, reqs in project.items() if group != "dev" for r in reqs}
    missing = {m: sorted(_distributions_of(m)) for m in _imports() if not _distributions_of(m) & declared}
    assert missing == {}, "imported by gateway/, providers/ or wire/ but not a runtime dependency (nor an extra)"


def test_the_import_scan_sees_imports_everywhere() -> None:
    # Guards the scan itself: a top-level import, one inside a function, and an extra's guarded import.
    found = _imports()
    assert {"litestar", "msgspec", "granian", "bpe_openai"} <= found
    assert "json" not in found and "gateway" not in found
