"""README's table of endpoints names every route the gateway serves.

The routes are read from the source: each Litestar route decorator's path in gateway/edge/, the dialect
routes (`DIALECT_ROUTES`), the chat routes (`CHAT_ROUTES`) and the tokenizer routes (also under
`/m/<vendor>/<model>`). A path parameter (`{name:str}`) matches any `<...>` the table writes in its place.
"""

from __future__ import annotations

import re
from pathlib import Path

from gateway.edge.app import CHAT_ROUTES, DIALECT_ROUTES
from gateway.edge.scoped_routes import SCOPED_PREFIX
from gateway.edge.tokenizer_routes import _METHOD

ROOT = Path(__file__).resolve().parents[2]


def served() -> set[str]:
    paths = set(DIALECT_ROUTES) | set(CHAT_ROUTES) | {f"/{route}" for route in _METHOD}
    for module in (ROOT / "gateway" / "edge").glob("*.py"):
        paths |= set(re.findall(r"@(?:get|post|delete|put|patch)\(\s*\"([^\"]+)\"", module.read_text()))
    return paths


def _table() -> str:
    readme = (ROOT / "README.md").read_text()
    return readme.split("## Endpoints", 1)[1].split("\n\n", 2)[1]


def _listed(path: str, table: str) -> bool:
    pattern = "<[^>]+>".join(re.escape(part) for part in re.split(r"\{[^}]+\}", path))
    return re.search(rf"`(?:GET|POST|DELETE) {pattern}`", table) is not None


def test_every_route_is_in_readmes_table() -> None:
    paths = served()
    assert {"/v1/completions", "/health", "/admin/keys", "/tokenize"} <= paths and len(paths) >= 20
    table = _table()
    assert not [p for p in sorted(paths) if not _listed(p, table)]
    assert f"`{SCOPED_PREFIX}<vendor>/<model>/v1/completions`" in table
    assert f"`{SCOPED_PREFIX}<vendor>/<model>/v1/chat/completions`" in table


def test_a_path_parameter_matches_its_placeholder() -> None:
    assert _listed("/admin/keys/{key_id:str}/rotate", "`POST /admin/keys/<id>/rotate`")
    assert not _listed("/admin/keys/{key_id:str}/rotate", "`POST /admin/keys/<id>`")
