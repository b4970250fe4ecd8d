"""Model patterns the operator writes (`keys[].models`, `teams.<name>.models`, `prices:` keys), held to what routes.

The router serves an alias, or `<provider>/<model>` for any model of a declared provider (listed or not), and
nothing else; both come from the config only. A pattern none of those strings can match (`lama/*` beside a
provider `llama`, a bare `gpt-4o`) is refused at load. A pattern that routes is never refused for its model
(which models a provider serves may be known only at run time); it is warned about when every provider it
reaches lists its models, asks its upstream for none, and it matches none of them (`openai/gpt-4o-mnii`).

Two dialects: a key's globs (gateway/limits/globs.py: `*`, `?` stop at `/`, `**` crosses it) and a price
key's (fnmatch: `*`, `?` cross `/`, `[...]` is a class), each run as a small automaton over a name, or over
`<provider>/` to see whether some model of that provider could match. Docs: docs/security.md (key globs).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Mapping
from typing import Literal

Dialect = Literal["key", "price"]
# A token: one literal character, one character of a class, or a run (`*`); `slash` says whether it takes `/`.
_Lit = tuple[Literal["lit"], str]
_One = tuple[Literal["one"], bool]
_Run = tuple[Literal["run"], bool]
_Class = tuple[Literal["class"], str]  # the `[...]` text, for fnmatch
Token = _Lit | _One | _Run | _Class
_WILD = {"key": re.compile(r"[*?]"), "price": re.compile(r"[*?\[]")}


def tokens(pattern: str, dialect: Dialect) -> list[Token]:
    out: list[Token] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "*":
            double = dialect == "key" and pattern.startswith("**", i)
            out.append(("run", dialect == "price" or double))
            i += 2 if double else 1
            continue
        if c == "?":
            out.append(("one", dialect == "price"))
        elif c == "[" and dialect == "price" and (end := _class_end(pattern, i)) is not None:
            out.append(("class", pattern[i : end + 1]))
            i = end + 1
            continue
        else:
            out.append(("lit", c))
        i += 1
    return out


def _class_end(pattern: str, i: int) -> int | None:
    """The index of the `]` closing the class opened at `i`, as fnmatch finds it; None: `[` is literal."""
    j = i + 1
    if j < len(pattern) and pattern[j] == "!":
        j += 1
    if j < len(pattern) and pattern[j] == "]":
        j += 1
    j = pattern.find("]", j)
    return None if j < 0 else j


def _takes(token: Token, c: str) -> bool:
    kind, arg = token
    if kind == "lit":
        return arg == c
    if kind == "class":
        return isinstance(arg, str) and fnmatch.fnmatchcase(c, arg)
    return bool(arg) or c != "/"


def _closure(toks: list[Token], states: Iterable[int]) -> set[int]:
    out: set[int] = set()
    todo = list(states)
    while todo:
        i = todo.pop()
        if i in out:
            continue
        out.add(i)
        if i < len(toks) and toks[i][0] == "run":
            todo.append(i + 1)  # a run may take nothing
    return out


def _run(toks: list[Token], text: str) -> set[int]:
    """The token positions the pattern can be at after reading `text`."""
    states = _closure(toks, {0})
    for c in text:
        moved = {i + (toks[i][0] != "run") for i in states if i < len(toks) and _takes(toks[i], c)}
        states = _closure(toks, moved)
        if not states:
            break
    return states


def matches(toks: list[Token], name: str) -> bool:
    return len(toks) in _run(toks, name)


def opens(toks: list[Token], prefix: str) -> bool:
    """Whether the pattern matches some string `prefix` + one or more characters: any position short of the
    end can still read at least one more character (a literal, a class, a `?`, or a run taking one)."""
    return any(i < len(toks) for i in _run(toks, prefix))


class ModelNames:
    """What a pattern is held to: the aliases, the providers (a replicated one's targets are also named
    `<provider>@<i>`, which a price may name), and each provider's models when the config lists all of them."""

    def __init__(
        self, aliases: Iterable[str], providers: Mapping[str, int], listed: Mapping[str, list[str]] | None = None
    ) -> None:
        self._alias_set = frozenset(aliases)
        self.aliases = sorted(self._alias_set)
        self.providers = dict(providers)  # name -> its replicas' count
        self.listed = dict(listed or {})  # provider -> its models, when it asks its upstream for none

    @property
    def routes(self) -> tuple[tuple[str, ...], tuple[tuple[str, int], ...]]:
        """What `problem` holds a pattern to, comparable between two configs."""
        return tuple(self.aliases), tuple(sorted(self.providers.items()))

    def problem(self, pattern: str, dialect: Dialect = "key") -> str | None:
        """Why no request could ever match `pattern`, or None. `**` (a key's default: every model) is never
        refused, and nothing is by a config that declares no provider: it routes nothing to hold a pattern to."""
        if pattern == "**" or not self.providers:
            return None
        toks = tokens(pattern, dialect)
        if self._reached(toks, dialect) or self._alias(toks, pattern, dialect):
            return None
        head, slash, _ = pattern.partition("/")
        known = ", ".join(self.providers) or "none"
        if _WILD[dialect].search(head):
            return f"{pattern!r} matches no alias and no <provider>/<model> (providers: {known})"
        if not slash:
            return f"{pattern!r} is neither an alias nor <provider>/<model>"
        if _WILD[dialect].search(pattern) or head not in self.providers:
            return f"{pattern!r} names no provider {head!r} (providers: {known}) and no alias"
        return f"{pattern!r} names no model of provider {head!r}"

    def unlisted(self, pattern: str, dialect: Dialect = "key") -> str | None:
        """Why `pattern`, which routes, likely matches nothing served: every provider it reaches lists its models
        in the config, asks its upstream for none, and it matches none of them nor an alias; else None."""
        toks = tokens(pattern, dialect)
        reached = self._reached(toks, dialect)
        if not reached or any(p not in self.listed for p in reached):
            return None
        for p in reached:
            if any(matches(toks, f"{h}/{m}") for h in self._heads(p, dialect) for m in self.listed[p]):
                return None
        if self._alias(toks, pattern, dialect):
            return None
        where = ", ".join(f"providers.{p}.models" for p in reached)
        return f"{pattern!r} matches no alias and none of the models {where} lists (requests for it still go upstream)"

    def _alias(self, toks: list[Token], pattern: str, dialect: Dialect) -> bool:
        """Whether the pattern matches an alias: only those starting with its literal head are run."""
        wild = _WILD[dialect].search(pattern)
        if wild is None:
            return pattern in self._alias_set
        head = pattern[: wild.start()]
        return any(matches(toks, a) for a in self.aliases if a.startswith(head))

    def _reached(self, toks: list[Token], dialect: Dialect) -> list[str]:
        """The providers some of whose `<provider>/<model>` strings the pattern matches."""
        return [p for p in self.providers if any(opens(toks, f"{h}/") for h in self._heads(p, dialect))]

    def _heads(self, provider: str, dialect: Dialect) -> list[str]:
        """What comes before the model in the strings a pattern of `dialect` is matched against."""
        replicas = self.providers[provider] if dialect == "price" else 0
        return [provider] + [f"{provider}@{i}" for i in range(replicas)]
