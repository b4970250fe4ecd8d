"""A default the docs state for a config key is the default the config has.

docs/config.md is generated from the typed config (and tests/unit/test_configdoc.py keeps it fresh), so
it is the reference: every other page's `| `key` | default |` table row, and every inline "`key` (N)",
"`key` (default N)" or "`key` (N by default)", must give the same value (sizes in KiB / MiB / GiB are
converted; a key written without its section, such as `cache.max_bytes`, is matched to the one key
of docs/config.md it ends). A number after a key that names no size unit is ignored for keys counted in
bytes, so "`caps.request_body_bytes` (413)" is the status, not a default.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *(p for p in sorted((ROOT / "docs").glob("*.md")) if p.name != "config.md")]
UNITS = {"": 1, "B": 1, "bytes": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3}
_NUMBER = r"(\d[\d,]*(?:\.\d+)?)\s*(KiB|MiB|GiB|bytes|B)?"
_INLINE = re.compile(r"`([a-z_.<>]+)`\s*\((?:default\s*)?\**" + _NUMBER + r"\**(?:\s*by default)?\)")
_ROW = re.compile(r"^\|\s*`([a-z_.<>]+)`\s*\|\s*" + _NUMBER + r"\s*\|", re.M)


def _value(number: str, unit: str | None) -> float:
    return float(number.replace(",", "")) * UNITS[unit or ""]


def reference() -> dict[str, float]:
    """Each key of docs/config.md whose default is a number: key -> value."""
    table = (ROOT / "docs" / "config.md").read_text()
    rows = re.findall(r"^\| `([^`]+)` \| [^|]+ \| `(\d+(?:\.\d+)?)`", table, re.M)
    return {key: float(default) for key, default in rows}


def _resolve(key: str, known: dict[str, float]) -> str | None:
    if key in known:
        return key
    # A key written without its section: the keys it ends, when they all have one default.
    ends = [k for k in known if k.endswith("." + key)]
    return ends[0] if ends and len({known[k] for k in ends}) == 1 else None


def stated(text: str) -> list[tuple[str, float, bool]]:
    """(key, value, has a unit) for every default a page states."""
    out = []
    for pattern in (_ROW, _INLINE):
        for key, number, unit in pattern.findall(text):
            out.append((key, _value(number, unit), bool(unit)))
    return out


def test_the_reference_holds_the_caps() -> None:
    known = reference()
    assert known["caps.request_body_bytes"] == 8 * 1024**2 and len(known) > 40


def test_every_stated_default_is_the_configs() -> None:
    known = reference()
    wrong, checked = [], 0
    for page in PAGES:
        for key, value, has_unit in stated(page.read_text()):
            full = _resolve(key, known)
            if full is None or (full.endswith("_bytes") and not has_unit):
                continue
            checked += 1
            if value != known[full]:
                wrong.append(f"{page.name}: `{key}` stated {value:g}, the config's default is {known[full]:g}")
    assert checked >= 15, checked
    assert not wrong, wrong


def test_a_wrong_default_is_caught() -> None:
    known = reference()
    planted = stated("| `caps.json_depth` | 32 | nesting |\nthe cap `caps.pattern_chars` (2,048) each")
    assert [(k, v) for k, v, _ in planted if known[_resolve(k, known) or k] != v] == [
        ("caps.json_depth", 32.0),
        ("caps.pattern_chars", 2048.0),
    ]
