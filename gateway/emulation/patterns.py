"""Regular expressions chosen by clients (`guided_regex`, JSON-schema `pattern`), run on RE2.

Python's `re` backtracks and a pattern is the client's to choose; RE2 is linear in the text and releases
the GIL. What RE2 cannot run in linear time, or a pattern over `caps.pattern_chars`, is a 400 naming the
field. Syntax differences from `re`: docs/security.md (item 3).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

import re2

from wire.errors import InvalidRequestError

_OPTIONS = re2.Options()
# A refused pattern is the client's 400, not a line on the gateway's stderr with the client's text in it.
_OPTIONS.log_errors = False
# The most RE2 may allocate for one compiled pattern (program and DFA cache): a pattern whose program does
# not fit is refused at compile time, and with the cache below this bounds what client patterns hold.
_OPTIONS.max_mem = 2 << 20


# Compiling costs about 2 ms per 1,000 RE2 instructions (`.{0,1000}` alone is 9,000): all the patterns of one
# request together are held to this, so compiling them stays on the order of 100 ms.
PROGRAM_BUDGET = 50_000


@functools.lru_cache(maxsize=64)
def _compiled(pattern: str) -> Any:
    return re2.compile(pattern, _OPTIONS)


def compile_pattern(pattern: str, *, param: str, limit: int) -> Any:
    """The compiled pattern, or a 400 naming `param` when it is too long or RE2 cannot run it."""
    if len(pattern) > limit:
        raise InvalidRequestError(
            f"'{param}' has a regular expression of {len(pattern)} characters; at most {limit} are allowed",
            param=param,
            code="invalid_value",
        )
    try:
        return _compiled(pattern)
    except re2.error as exc:
        reason = exc.args[0] if exc.args else ""
        if isinstance(reason, bytes):
            reason = reason.decode("utf-8", "replace")
        raise InvalidRequestError(
            f"'{param}' has a regular expression the gateway cannot run in linear time (RE2 syntax; no "
            f"backreferences or lookaround): {str(reason)[:200]}",
            param=param,
            code="invalid_value",
        ) from None


def compile_all(patterns: Iterable[str], *, param: str, limit: int) -> dict[str, Any]:
    """Admit every pattern of one request: each within `limit` characters, all together within PROGRAM_BUDGET.

    Returns them compiled, for the request to keep (the shared cache may evict them meanwhile)."""
    out: dict[str, Any] = {}
    size = 0
    for pattern in patterns:
        if pattern in out:
            continue
        out[pattern] = rx = compile_pattern(pattern, param=param, limit=limit)
        size += rx.programsize
        if size > PROGRAM_BUDGET:
            raise InvalidRequestError(
                f"'{param}' has regular expressions too large together for the gateway to check "
                f"(more than {PROGRAM_BUDGET} RE2 instructions)",
                param=param,
                code="invalid_value",
            )
    return out


# RE2 is linear in the text, but the constant is the pattern's: where its DFA does not fit, RE2 simulates
# the automaton at about 0.3 ns per character per instruction (measured: 5 us per character for an
# 18,000-instruction pattern). A match may cost at most this many character-instructions, about a second.
MATCH_WORK = 4_000_000_000


def affordable(pattern: Any, text: str) -> bool:
    """Whether matching `text` against a compiled pattern stays within MATCH_WORK in the worst case."""
    size: int = pattern.programsize
    return len(text) * size <= MATCH_WORK


def compiled(pattern: str) -> Any:
    """A pattern already admitted by `compile_pattern` (cached; RE2 objects are safe across threads)."""
    return _compiled(pattern)


__all__ = ["MATCH_WORK", "PROGRAM_BUDGET", "affordable", "compile_all", "compile_pattern", "compiled"]
