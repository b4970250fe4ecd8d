"""The docs' lists of provider kinds agree with the registry (providers/registry.py), the one list of kinds.

A kind added to the registry and forgotten in a page fails here: README's `check-config` example is the
loader's own message; a paragraph that lists most kinds lists them all; a list of the OpenAI-compatible
kinds is the registry's subclasses of that base; a table keyed by `kind` names each kind once (or has an
"every other kind" row); the lists of self-hosted kinds (replicas, discovery by default, native sampling
fields) are the kinds whose adapters declare it. Pages are read, not rendered.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gateway.config import ConfigError
from gateway.config.loading import parse_config
from providers.openai_compat import OpenAICompatible
from providers.registry import REGISTRY, kinds

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
KINDS = set(kinds())
# A paragraph that names this many kinds is taken for a list of every kind.
MOST = 12
# The names prose uses for the self-hosted kinds.
PROSE = {"vllm": "vLLM", "sglang": "SGLang", "llamacpp": "llama.cpp", "tgi": "TGI", "ollama": "Ollama"}


def _flat(text: str) -> str:
    return " ".join(text.split())


def _paragraphs() -> list[tuple[str, str]]:
    return [
        (page.relative_to(ROOT).as_posix(), para)
        for page in PAGES
        for para in re.split(r"\n\s*\n", page.read_text())
        if not para.lstrip().startswith("|")
    ]


def _kind_tables() -> list[tuple[str, list[str]]]:
    """Each table whose first column is `kind`, as the first cells of its rows."""
    tables = []
    for page in PAGES:
        for table in re.findall(r"^\| kind \|[^\n]*\n\|[-| ]+\|\n((?:\|[^\n]*\n)+)", page.read_text(), re.M):
            tables.append((page.relative_to(ROOT).as_posix(), [row.split("|")[1] for row in table.splitlines()]))
    return tables


def _named(cell: str) -> list[str]:
    return [word for word in re.findall(r"[a-z_]+", cell) if word in KINDS]


def test_readme_check_config_example_is_the_loaders_own_message() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config("providers:\n  x: {kind: opnai}\n", "config.yaml", env={})
    assert f"`config error: {caught.value}`" in _flat((ROOT / "README.md").read_text())


def test_a_paragraph_that_lists_most_kinds_lists_every_kind() -> None:
    short = {
        f"{page}: {_flat(para)[:60]}...": sorted(KINDS - found)
        for page, para in _paragraphs()
        if len(found := {t for t in re.findall(r"`([a-z_]+)`", para) if t in KINDS}) >= MOST and found != KINDS
    }
    assert not short, short


def test_a_list_of_the_openai_compatible_kinds_is_the_family() -> None:
    family = {kind for kind, cls in REGISTRY.items() if issubclass(cls, OpenAICompatible)}
    runs = [
        (page, found)
        for page, para in _paragraphs()
        if "OpenAI-compatible" in para
        for run in re.findall(r"`[a-z_]+`(?:,\s+`[a-z_]+`){4,}", para)
        if len(found := {k for k in re.findall(r"`([a-z_]+)`", run) if k in KINDS}) >= 5
    ]
    assert len(runs) >= 2, runs  # README's list of kinds and provider-notes.md's
    assert all(found == family for _, found in runs), [(p, sorted(family ^ f)) for p, f in runs if f != family]


def test_a_table_by_kind_names_each_kind_once() -> None:
    tables = _kind_tables()
    assert len(tables) >= 6  # the clients' and providers' pages hold these tables
    for page, cells in tables:
        named = [kind for cell in cells for kind in _named(cell)]
        assert len(named) == len(set(named)), f"{page}: a kind is in two rows: {cells}"
        if not any(cell.strip().startswith("every other kind") for cell in cells):
            assert set(named) == KINDS, f"{page}: the table by kind lacks {sorted(KINDS - set(named))}"


def test_the_lists_of_self_hosted_kinds_are_what_the_adapters_declare() -> None:
    replicas = {kind for kind, cls in REGISTRY.items() if getattr(cls, "serves_replicas", False)}
    listed = {kind for kind, cls in REGISTRY.items() if (getattr(cls, "model_listing", None) or ("", False))[1]}
    assert replicas and listed and set(PROSE) >= replicas | listed  # a new one needs its prose name here
    # docs/fleets.md names the kinds that may run replicas in its first parenthesized list of them.
    fleets = (ROOT / "docs" / "fleets.md").read_text()
    lists = [group for group in re.findall(r"\(([^()]*)\)", fleets) if len(_named(group)) >= 3 and "`" in group]
    assert lists and set(_named(lists[0])) == replicas, lists[:1]
    readme = _flat((ROOT / "README.md").read_text())
    discovered = re.search(r"discovered in the background from ([^)]*)\)", readme)
    assert discovered is not None
    assert {k for k, name in PROSE.items() if name in discovered.group(1)} == listed, discovered.group(1)


def test_the_native_sampling_fields_table_agrees_with_the_generated_matrix() -> None:
    """docs/clients.md's table of self-hosted fields, cell by cell against docs/providers.md (generated)."""
    # The completion parameters' table: the chat table after it has the same columns.
    matrix = (ROOT / "docs" / "providers.md").read_text().split("## Chat parameters")[0].splitlines()
    head = next(line for line in matrix if line.startswith("| field | openai |"))
    columns = [c.strip() for c in head.split("|")[1:-1]]
    takes = {
        (row[0].strip("`"), kind): row[i] != "-"
        for line in matrix
        if line.startswith("| `")
        for row in [[c.strip() for c in line.split("|")[1:-1]]]
        if len(row) == len(columns)
        for i, kind in enumerate(columns)
    }
    text = (ROOT / "docs" / "clients.md").read_text()
    found = re.search(r"^(\| field \| type \|[^\n]*)\n\|[-|]+\|\n((?:\|[^\n]*\n)+)", text, re.M)
    assert found is not None
    kinds_ = [c.strip() for c in found.group(1).split("|")[3:-1]]
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in found.group(2).splitlines()]
    fields = [re.findall(r"`([a-z_]+)`", row[0])[0] for row in rows]
    # Its columns are every kind that takes one of its fields, and no other.
    assert set(kinds_) == {k for k in KINDS if any(takes.get((f, k), False) for f in fields)}, kinds_
    checked = 0
    for field, row in zip(fields, rows, strict=True):
        for kind, cell in zip(kinds_, row[2:], strict=True):
            if (field, kind) in takes:
                assert (cell != "-") == takes[field, kind], f"docs/clients.md: {field} for {kind}: {cell!r}"
                checked += 1
    assert checked > 50
