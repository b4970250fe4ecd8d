"""Every module of gateway/, providers/ and wire/ opens with a short docstring: what it is and why.

Sources, provider quirks and history belong in docs/ (docs/provider-notes.md and the concept pages), so a
docstring over MAX_LINES lines, or a missing or empty one, fails here (parsed, not imported).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("gateway", "providers", "wire")
MAX_LINES = 12

MODULES = sorted(p.relative_to(ROOT).as_posix() for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def _docstring(module: str) -> str | None:
    return ast.get_docstring(ast.parse((ROOT / module).read_text(encoding="utf-8")), clean=False)


def test_the_packages_are_found() -> None:
    # An empty MODULES (a moved root, a renamed package) would make every check below pass vacuously.
    for pkg in PACKAGES:
        assert f"{pkg}/__init__.py" in MODULES
    assert len(MODULES) > 40


@pytest.mark.parametrize("module", MODULES)
def test_module_docstring_is_present_and_short(module: str) -> None:
    doc = _docstring(module)
    assert doc is not None and doc.strip(), f"{module} has no module docstring"
    lines = len(doc.strip().splitlines())
    assert lines <= MAX_LINES, f"{module}: module docstring is {lines} lines (max {MAX_LINES}); detail goes to docs/"
