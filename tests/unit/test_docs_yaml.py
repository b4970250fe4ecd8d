"""Every YAML block of README.md and docs/*.md loads with the real config loader, as written.

The rule, so a reader can copy any block: a ```yaml block is a gateway config unless its top level is
another program's (Kubernetes' `apiVersion`, Prometheus' `scrape_configs`), which is only parsed as YAML.
A gateway block that declares `providers:` is a whole config and is loaded alone; one without is a
fragment, set over the shipped config.yaml (each top-level key it names replaces the shipped one). Both go
through `parse_config`, the loader `serve` and `check-config` run, with no environment variables set. A
key written twice in one mapping fails too (YAML would keep the last one silently). A broken block planted
in a page is caught (the last tests), so this cannot pass by finding nothing.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.config import ConfigError
from gateway.config.loading import parse_config

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FOREIGN = ("apiVersion", "scrape_configs")
_BLOCK = re.compile(r"^```ya?ml[^\n]*\n(.*?)^```", re.S | re.M)


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key written twice in one mapping."""


def _mapping(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"key {key!r} written twice (line {key_node.start_mark.line + 1})"
            )
        seen.add(key)
    return loader.construct_mapping(node)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


def blocks(text: str) -> list[tuple[int, str]]:
    """Each ```yaml block of a page with the line its fence is on."""
    return [(text[: m.start()].count("\n") + 1, m.group(1)) for m in _BLOCK.finditer(text)]


def problem(block: str, where: str) -> str | None:
    """Why `block` does not load as the rule above says, or None when it does."""
    try:
        data = yaml.load(block, Loader=_StrictLoader)  # noqa: S506 -- a SafeLoader subclass
    except yaml.YAMLError as exc:
        return f"{where}: not YAML: {exc}"
    if not isinstance(data, dict):
        return f"{where}: the top level is not a mapping"
    if any(key in data for key in FOREIGN):
        return None
    if "providers" not in data:
        shipped = yaml.safe_load((ROOT / "config.yaml").read_text())
        data = {**shipped, **data}
    try:
        parse_config(yaml.safe_dump(data, sort_keys=False), where, env={})
    except ConfigError as exc:
        return str(exc)
    return None


CASES = [
    pytest.param(block, f"{page.relative_to(ROOT)}:{line}", id=f"{page.relative_to(ROOT)}:{line}")
    for page in PAGES
    for line, block in blocks(page.read_text())
]


def test_the_pages_hold_yaml_blocks() -> None:
    assert len(CASES) >= 15  # README and the feature pages show configs; an empty list would prove nothing


@pytest.mark.parametrize(("block", "where"), CASES)
def test_each_documented_yaml_block_loads(block: str, where: str) -> None:
    assert problem(block, where) is None


def _planted(page: str, old: str, new: str) -> list[str | None]:
    text = (ROOT / page).read_text()
    assert old in text, f"{page} no longer holds {old!r}: plant the fault somewhere else"
    return [problem(b, f"{page}:{line}") for line, b in blocks(text.replace(old, new, 1))]


def test_a_broken_whole_config_is_caught() -> None:
    found = [p for p in _planted("README.md", "kind: vllm", "kind: vlm") if p]
    assert len(found) == 1 and "kind" in found[0], found


def test_a_broken_fragment_is_caught() -> None:
    text = (ROOT / "README.md").read_text() + "\n```yaml\nretries: {attempts: many}\n```\n"
    found = [p for p in (problem(b, f"README.md:{line}") for line, b in blocks(text)) if p]
    assert len(found) == 1 and "retries.attempts" in found[0], found


def test_a_key_written_twice_is_caught() -> None:
    assert "written twice" in (problem("redis: {url: ''}\nredis: {url: ''}\n", "page.md:1") or "")


def test_a_foreign_block_is_only_parsed() -> None:
    assert problem("apiVersion: v1\nkind: ConfigMap\n", "page.md:1") is None
    assert problem("apiVersion: v1\n  kind: [\n", "page.md:1") is not None
