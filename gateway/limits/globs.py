"""Model globs: which model strings a client key may call (`keys[].models`, and its team's `teams.<name>.models`).

`*` and `?` stop at `/` (model names contain slashes), `**` does not; patterns run on RE2 and answers are
memoized per key. A key of a team holds its own globs `within` the team's: one memo answers for both. The
syntax with examples: docs/security.md (key globs).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import re2

# Distinct model strings remembered per key; client-chosen strings cannot grow it past this.
_CACHE_LIMIT: Final = 4096


def translate(glob: str) -> str:
    """The RE2 pattern (without anchors) of one glob."""
    out: list[str] = []
    i = 0
    while i < len(glob):
        c = glob[i]
        if c == "*":
            if glob.startswith("**", i):
                out.append(".*")
                i += 2
                continue
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        else:
            out.append(re2.escape(c))
        i += 1
    return "".join(out)


class ModelGlobs:
    """A key's model patterns; `match(model)` says whether the key may call `model`. `ceiling`: the patterns
    of the key's team, which a model must match too (None: the key's own alone)."""

    __slots__ = ("_cache", "_pattern", "ceiling", "patterns")

    def __init__(self, patterns: Sequence[str]) -> None:
        self.patterns = tuple(patterns)
        options = re2.Options()
        options.log_errors = False
        options.never_capture = True
        options.dot_nl = True
        source = "|".join(f"(?:{translate(p)})" for p in self.patterns)
        self._pattern = re2.compile(source, options) if source else None
        self._cache: dict[str, bool] = {}
        self.ceiling: ModelGlobs | None = None

    def within(self, ceiling: ModelGlobs | None) -> ModelGlobs:
        """These patterns held to `ceiling` as well (a team's `models`); itself when there is none. Made once per
        key and config, sharing the compiled pattern: its own memo answers for both, so a request still pays
        one dict lookup."""
        if ceiling is None:
            return self
        bound = ModelGlobs.__new__(ModelGlobs)
        bound.patterns, bound._pattern, bound._cache, bound.ceiling = self.patterns, self._pattern, {}, ceiling
        return bound

    def match(self, model: str) -> bool:
        found = self._cache.get(model)
        if found is None:
            found = self._pattern is not None and self._pattern.fullmatch(model) is not None
            if found and self.ceiling is not None:
                found = self.ceiling.match(model)
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.clear()
            self._cache[model] = found
        return found


__all__ = ["ModelGlobs", "translate"]
