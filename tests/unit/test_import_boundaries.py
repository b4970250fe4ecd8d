"""The package boundaries of docs/architecture.md, checked on every module's imports (parsed, not run).

    wire       imports nothing of ours
    providers  imports wire and providers; an adapter module (a line of providers/registry.py) is imported
               by no module of ours: it is reached through the registry only, so no adapter imports another
    gateway    imports wire, providers (not the adapter modules) and gateway

Inside gateway/, the wings of `gateway.LAYERS`: a module imports its own wing and the layers below it,
never a layer above or a sibling wing of its own layer, and no import circle runs through any modules.
Imports under `if TYPE_CHECKING:` and inside functions count: they are dependencies all the same.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from gateway import LAYERS
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


def wing_of(module: str, layers: tuple[tuple[str, ...], ...] = LAYERS) -> str | None:
    """The wing (a sub-package, or a module of the base) of `gateway.LAYERS` that `module` belongs to."""
    for layer in layers:
        for wing in layer:
            if module == wing or module.startswith(wing + "."):
                return wing
    return None


def layer_violations(
    importer: str, source: str, *, is_package: bool = False, layers: tuple[tuple[str, ...], ...] = LAYERS
) -> list[str]:
    """Each import of `source` (the gateway module `importer`) that runs up the layers or sideways."""
    rank = {wing: i for i, layer in enumerate(layers) for wing in layer}
    here = wing_of(importer, layers)
    package = importer if is_package else importer.rpartition(".")[0]
    found: list[str] = []
    for line, module in imported(source, package):
        if module == "gateway" or not module.startswith("gateway."):
            continue  # the root package (LAYERS itself) and everything outside gateway/
        there = wing_of(module, layers)
        if here is None or there is None:
            found.append(f"{importer}:{line} -> {module} (not in a layer)")
        elif there != here and rank[there] <= rank[here]:
            found.append(f"{importer}:{line} -> {module}")
    return sorted(set(found))


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of `graph` (module -> modules it imports): each strongly connected component
    of more than one module, or a module importing itself; sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component: list[str] = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1 or node in graph.get(node, ()):
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def gateway_graph() -> dict[str, set[str]]:
    """Every gateway module and the gateway modules it imports (a package by its `__init__`)."""
    found = {name: path for name, path in modules().items() if name.startswith("gateway")}
    graph: dict[str, set[str]] = {}
    for name, path in found.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        imports = imported(path.read_text(encoding="utf-8"), package)
        graph[name] = {module for _, module in imports if module in found and module != name}
    return graph


def test_every_gateway_module_is_in_a_layer_and_imports_only_downward() -> None:
    found = {name: path for name, path in modules().items() if name.startswith("gateway.")}
    # Not vacuous: every wing is declared, exists and holds modules.
    wings = [wing for layer in LAYERS for wing in layer]
    assert len(wings) == len(set(wings)) >= 8
    assert all(any(wing_of(name) == wing for name in found) for wing in wings)
    assert [name for name in found if wing_of(name) is None] == []
    crossings = [
        v
        for name, path in found.items()
        for v in layer_violations(name, path.read_text(encoding="utf-8"), is_package=path.name == "__init__.py")
    ]
    assert crossings == []


def test_every_wing_says_what_it_owns_and_what_it_may_import() -> None:
    for layer in LAYERS:
        for wing in layer:
            init = ROOT.joinpath(*wing.split("."), "__init__.py")
            if not init.is_file():
                continue  # a module of the base: its own docstring (tests/unit/test_docstrings.py)
            doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
            assert "May import" in doc, f"{wing}/__init__.py does not say what it may import"


def test_there_is_no_import_cycle_in_gateway() -> None:
    graph = gateway_graph()
    assert {"gateway.upstream.client", "gateway.ops.tracing", "gateway.path.routing"} <= set(graph)
    assert "gateway.upstream.transport" in graph["gateway.upstream.httpx_transport"]  # edges are seen
    assert cycles(graph) == []


LAYERS_UNDER_TEST = (
    ("gateway.edge",),
    ("gateway.path",),
    ("gateway.resilience", "gateway.emulation"),
    ("gateway.ops",),
)


@pytest.mark.parametrize(
    ("importer", "source", "expected"),
    [
        # up one layer, up several, only for type checking, inside a function, relative
        (
            "gateway.resilience.balancer",
            "from gateway.path.routing import Plan",
            ["gateway.resilience.balancer:1 -> gateway.path.routing"],
        ),
        (
            "gateway.ops.reload",
            "from gateway.edge import app",
            ["gateway.ops.reload:1 -> gateway.edge", "gateway.ops.reload:1 -> gateway.edge.app"],
        ),
        (
            "gateway.ops.tracing",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from gateway.path.routing import Route",
            ["gateway.ops.tracing:3 -> gateway.path.routing"],
        ),
        (
            "gateway.ops.metrics",
            "def f():\n    import gateway.path.pipeline",
            ["gateway.ops.metrics:2 -> gateway.path.pipeline"],
        ),
        (
            "gateway.ops.tracing",
            "from ..path import routing",
            ["gateway.ops.tracing:1 -> gateway.path", "gateway.ops.tracing:1 -> gateway.path.routing"],
        ),
        # sideways: two wings of one layer
        (
            "gateway.emulation.planning",
            "from gateway.resilience.health import Health",
            ["gateway.emulation.planning:1 -> gateway.resilience.health"],
        ),
        # a module (or a wing) the layers do not name
        ("gateway.cache.store", "import msgspec", []),
        (
            "gateway.path.pipeline",
            "from gateway.ledger import Book",
            ["gateway.path.pipeline:1 -> gateway.ledger (not in a layer)"],
        ),
        # allowed: down, within the wing, the root package
        ("gateway.edge.app", "from gateway.ops.metrics import Metrics\nfrom gateway.edge.render import render", []),
        ("gateway.path.pipeline", "from gateway.path.relay import Relay\nfrom gateway import LAYERS", []),
    ],
)
def test_a_planted_upward_import_is_found(importer: str, source: str, expected: list[str]) -> None:
    assert layer_violations(importer, source, layers=LAYERS_UNDER_TEST) == expected


@pytest.mark.parametrize(
    ("graph", "expected"),
    [
        # the two circles the wings cut: a transport and its client, tracing through routing
        ({"u.client": {"u.httpx"}, "u.httpx": {"u.client", "u.h1"}, "u.h1": set()}, [["u.client", "u.httpx"]]),
        ({"up": {"tr"}, "tr": {"ro"}, "ro": {"up"}, "x": {"up"}}, [["ro", "tr", "up"]]),
        ({"a": {"a"}}, [["a"]]),
        ({"a": {"b"}, "b": {"c"}, "c": set()}, []),
    ],
)
def test_a_planted_cycle_is_found(graph: dict[str, set[str]], expected: list[list[str]]) -> None:
    assert cycles(graph) == expected


def test_no_module_is_over_500_lines() -> None:
    found = modules()
    assert len(found) > 60
    long = {name: n for name, path in found.items() if (n := len(path.read_text(encoding="utf-8").splitlines())) > 500}
    assert long == {}
