"""docs/providers.md is generated from the adapters' tables; it must never drift from them."""

from __future__ import annotations

from pathlib import Path

from providers.matrix import render

DOC = Path(__file__).resolve().parents[2] / "docs" / "providers.md"


def test_providers_doc_is_current() -> None:
    assert DOC.read_text(encoding="utf-8") == render(), (
        "docs/providers.md is stale: run `.venv/bin/python -m providers.matrix > docs/providers.md`"
    )


def test_matrix_refuses_what_tables_lack() -> None:
    text = render()
    row = next(line for line in text.splitlines() if line.startswith("| `guided_json` |"))
    # vLLM maps guided_json to structured outputs; OpenAI has no constrained decoding on completions.
    assert "`structured_outputs.json`" in row
    assert row.split("|")[2].strip() == "-"
