"""The package boundaries of docs/architecture.md, checked on every module's imports (parsed, not run).

    wire       imports nothing of ours
    providers  imports wire and providers; an adapter module (a line of providers/registry.py) is imported
               by no module of ours: it is reached through the registry only, so no adapter imports another
    gateway    imports wire, providers (not the adapter modules) and gateway

Imports under `if TYPE_CHECKING:` and inside functions count: they are dependencies all the same.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from providers.registry import BUILTIN

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("wire", "providers", "gateway")
OURS = (*PACKAGES, "bench", "tests")
ADAPTERS = frozenset(target.partition(":")[0] for target in BUILTIN)
# What each package may import of ours (itself included).
ALLOWED = {"wire": {"wire"}, "providers": {"wire", "providers"}, "gateway": {"wire", "providers", "gateway"}}


def _is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imported(source: str, package: str) -> list[tuple[int, str]]:
    """(line, module) for every import in `source`; `from a import b` also yields `a.b` when b is a module.
    `package` is the one relative imports start from."""
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against the importer's package
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(p for p in [*parts, base] if p)
            out.append((node.lineno, base))
            out += [(node.lineno, f"{base}.{alias.name}") for alias in node.names if _is_module(f"{base}.{alias.name}")]
    return out


def violations(
    importer: str, source: str, *, is_package: bool = False, adapters: frozenset[str] = ADAPTERS
) -> list[str]:
    """Each import of `source` (the module `importer`) that crosses a boundary, as `importer:line -> module`."""
    top = importer.partition(".")[0]
    found: list[str] = []
    package = importer if is_package else importer.rpartition(".")[0]
    for line, module in imported(source, package):
        target = module.partition(".")[0]
        if target not in OURS or module == importer:
            continue
        crossing = target not in ALLOWED.get(top, set(OURS))
        if module in adapters and module != importer and top in PACKAGES:
            crossing = True
        if crossing:
            found.append(f"{importer}:{line} -> {module}")
    return sorted(set(found))


def modules() -> dict[str, Path]:
    """Every module of the three packages, by dotted name (a package by its own name: its __init__.py)."""
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def test_no_module_crosses_the_package_boundaries() -> None:
    found = modules()
    # Not vacuous: every package and every registered adapter module is scanned.
    assert {"wire.errors", "wire.schema", "providers.base", "gateway.path.pipeline"} <= set(found)
    assert ADAPTERS <= set(found) and len(ADAPTERS) == len(BUILTIN)
    crossings = [
        v
        for name, path in found.items()
        for v in violations(name, path.read_text(encoding="utf-8"), is_package=path.name == "__init__.py")
    ]
    assert crossings == []


@pytest.mark.parametrize(
    ("importer", "source", "expected"),
    [
        # providers -> gateway, also when only for type checking
        ("providers.fake", "from gateway.config import CapsConfig", ["providers.fake:1 -> gateway.config"]),
        (
            "providers.fake",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from gateway import config",
            ["providers.fake:3 -> gateway", "providers.fake:3 -> gateway.config"],
        ),
        # one adapter importing another (what bedrock did with anthropic.out_of_range), absolute or relative
        (
            "providers.bedrock",
            "from providers.anthropic import out_of_range",
            ["providers.bedrock:1 -> providers.anthropic"],
        ),
        ("providers.bedrock", "from . import anthropic", ["providers.bedrock:1 -> providers.anthropic"]),
        ("providers.cohere", "def f():\n    import providers.mistral", ["providers.cohere:2 -> providers.mistral"]),
        # the bottom package importing anything of ours
        ("wire.errors", "import providers.base", ["wire.errors:1 -> providers.base"]),
        ("wire.schema", "from gateway.upstream.h1 import Pool", ["wire.schema:1 -> gateway.upstream.h1"]),
        # the gateway naming an adapter instead of asking the registry
        (
            "gateway.path.routing",
            "from providers.azure import AzureAdapter",
            ["gateway.path.routing:1 -> providers.azure"],
        ),
        ("gateway.path.pipeline", "import tests.e2e.harness", ["gateway.path.pipeline:1 -> tests.e2e.harness"]),
        # allowed
        ("providers.bedrock", "from providers.base import stop_list\nfrom wire.errors import GatewayError", []),
        ("providers.vllm", "from providers.openai_compat import OpenAICompatible\nimport msgspec", []),
        ("gateway.config", "from providers.registry import REGISTRY\nfrom wire.schema import MAX_LOGPROBS", []),
        ("wire.schema", "import msgspec\nfrom typing import Any", []),
    ],
)
def test_a_planted_crossing_is_found(importer: str, source: str, expected: list[str]) -> None:
    assert violations(importer, source) == expected
