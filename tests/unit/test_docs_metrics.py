"""Every metric the gateway exports is documented, and every metric the docs name is exported.

Metric names are read from the source (each `gateway_...` string literal of gateway/ handed to a metric
constructor or a collector), and from README.md and docs/*.md (each `gateway_...` word, with the suffixes
Prometheus adds, `_total`, `_created`, `_bucket`, `_sum`, `_count`, taken off). A metric added without a
line in the docs, or a documented one renamed or removed, fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_SUFFIXES = re.compile(r"_(total|created|bucket|sum|count)$")
# Names in quotes that are not metrics: context variables of the tracing hooks.
_NOT_METRICS = re.compile(r"ContextVar\(\s*\"(gateway_[a-z_]+)\"")


def exported() -> set[str]:
    names: set[str] = set()
    for path in (ROOT / "gateway").rglob("*.py"):
        text = path.read_text()
        names |= set(re.findall(r"\"(gateway_[a-z_]+)\"", text)) - set(_NOT_METRICS.findall(text))
    return names


def documented() -> set[str]:
    words = {w for page in PAGES for w in re.findall(r"\bgateway_[a-z_]+\b", page.read_text())}
    return {_SUFFIXES.sub("", w) for w in words}


def test_every_exported_metric_is_documented() -> None:
    names = exported()
    assert {"gateway_requests", "gateway_in_flight", "gateway_ledger_queued_rows"} <= names
    assert not names - documented(), sorted(names - documented())


def test_every_documented_metric_is_exported() -> None:
    names = exported()
    # A documented name may be a histogram's or counter's series; its base name is what the source holds.
    missing = sorted(n for n in documented() if n not in names)
    assert not missing, missing
