"""No pattern for Python's backtracking `re` is built at run time in the gateway or the providers.

A pattern built from text (a client's stop sequences, a model name, an upstream's answer) is that text's
to shape, and `re` backtracks. Such text goes to RE2 (gateway/emulation/patterns.py, gateway/limits/globs.py)
or to plain string operations. Every `re` call here must take a pattern written in the source.

A msgspec `Meta(pattern=...)` is searched, and `$` also matches before a final newline: such patterns are
anchored with `\\A` and `\\Z`.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CALLS = {"compile", "search", "match", "fullmatch", "sub", "subn", "split", "findall", "finditer"}
# Patterns built from the operator's config only, applied to text of bounded length.
OPERATOR_ONLY = {
    # `prices:` keys (operator globs) through fnmatch.translate, matched against model names of at most
    # 256 characters (gateway.path.request.MAX_MODEL_CHARS).
    "gateway/limits/prices.py",
}
# Patterns built from names written in the source, escaped literals with no other text in them.
SOURCE_NAMES = {
    # The engine-metrics scan: the metric names each kind declares (providers/engine.py), escaped, so that a
    # line of another series costs the C engine alone (a Python step per line let a replica block the loop).
    "gateway/fleet/exposition.py",
}


def dynamic_patterns(source: str) -> list[int]:
    """The lines of `re.<call>(pattern, ...)` whose pattern is not a string literal."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "re"
            and node.func.attr in CALLS
            and node.args
            and not (isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str | bytes))
        ):
            lines.append(node.lineno)
    return lines


def test_the_check_sees_a_built_pattern() -> None:
    # The shape the stop scanner had: a character class made of the client's stops' first characters.
    built = 'import re\nstarts = re.compile("[" + "".join(map(re.escape, firsts)) + "]")\n'
    assert dynamic_patterns(built) == [2]
    assert dynamic_patterns('import re\nre.compile(r"[a-z]+")\n') == []
    assert dynamic_patterns('import re\nre.compile(rb"[a-z]+")\n') == []  # bytes, written in the source too
    assert dynamic_patterns('import re\nre.compile(b"[" + first + b"]")\n') == [2]


def test_no_re_pattern_is_built_from_text() -> None:
    found = []
    for package in ("gateway", "providers", "wire"):
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel in OPERATOR_ONLY or rel in SOURCE_NAMES:
                continue
            found += [f"{rel}:{line}" for line in dynamic_patterns(path.read_text())]
    assert found == []


def dollar_anchored(source: str) -> list[int]:
    """The lines of `Meta(pattern=...)` whose pattern holds an unescaped `$`.

    msgspec matches such a pattern with `re.search`, where `$` also matches before a final newline: "alice\\n"
    passed `^[a-z]+$`. Such a pattern ends with `\\Z` instead."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
        if name != "Meta":
            continue
        for kw in node.keywords:
            if kw.arg == "pattern" and isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, str):
                text = kw.value.value
                if any(c == "$" and (i == 0 or text[i - 1] != "\\") for i, c in enumerate(text)):
                    lines.append(node.lineno)
    return lines


def test_the_check_sees_a_dollar_anchor() -> None:
    assert dollar_anchored('Name = Annotated[str, Meta(pattern=r"^[a-z]{1,64}$")]\n') == [1]
    assert dollar_anchored('Name = Annotated[str, msgspec.Meta(pattern=r"^$|^[a-z]+-\\d+$")]\n') == [1]
    assert dollar_anchored('Name = Annotated[str, Meta(pattern=r"\\A[a-z$]{1,64}\\Z")]\n') == [1]
    assert dollar_anchored('Name = Annotated[str, Meta(pattern=r"\\A[a-z]{1,64}\\Z")]\n') == []
    assert dollar_anchored('Price = Annotated[str, Meta(pattern=r"\\A\\$[0-9]+\\Z")]\n') == []


def test_no_msgspec_pattern_ends_with_dollar() -> None:
    found = []
    for package in ("gateway", "providers", "wire"):
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            found += [f"{rel}:{line}" for line in dollar_anchored(path.read_text())]
    assert found == []
