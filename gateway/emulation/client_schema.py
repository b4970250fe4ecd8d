"""JSON Schemas chosen by clients (`guided_json`, `response_format`), admitted once and checked within bounds.

Plain `jsonschema` would let a schema backtrack, fetch a remote `$ref` or recurse without end, so `admit`
(a 400 naming the field otherwise) walks and compiles a schema within bounds before any upstream call,
and each answer is checked with RE2, no network and a work cap. The rules: docs/security.md (item 3).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from types import MappingProxyType
from typing import Any
from urllib.parse import unquote

import referencing
from jsonschema import (
    Draft3Validator,
    Draft4Validator,
    Draft6Validator,
    Draft7Validator,
    Draft202012Validator,
    ValidationError,
)
from jsonschema.validators import extend, validator_for

from gateway.emulation.patterns import affordable, compile_all, compiled
from wire.errors import InvalidRequestError

# Keyword evaluations cost about 10 us each. Admitting a schema (on the event loop, before the upstream
# call) may take ADMIT_WORK of them, about 0.2 s at most: checking a subschema against the 2020-12
# meta-schema takes about 50, so a few hundred subschemas fit. Checking answers (in worker threads) is
# held to one `Work` per request: `caps.guided_work` evaluations for all its choices and retries together.
ADMIT_WORK = 20_000
# A schema of at most this many subschemas and pattern characters is admitted whole on the event loop (a
# few ms); a larger one is finished (`Checker.finish`) off it, before any upstream call.
LOOP_NODES = 64
LOOP_PATTERN_CHARS = 256
# A regex match is priced in evaluations: RE2 at its slowest (0.3 ns per character x instruction, see
# gateway/emulation/patterns.py) does this many character x instructions in about an evaluation's 10 us.
RE2_STEP = 32_768


def match_steps(pattern: Any, text: str) -> int:
    """What matching `text` against a compiled pattern costs a request's `Work`, at worst."""
    return len(text) * int(pattern.programsize) // RE2_STEP


# A check draws this many evaluations from its request's budget at a time, and looks at the deadline then.
_DRAW = 200


class WorkExhausted(Exception):
    """A request's checking budget or deadline ran out: no answer of it can be vouched for any more."""

    def __init__(self, message: str, *, deadline: bool = False) -> None:
        super().__init__(message)
        self.deadline = deadline


class Work:
    """What one request may spend checking answers: keyword evaluations, shared by every choice and retry
    (threads draw from it under a lock), until its deadline (`time.monotonic()`), or until `stop()`."""

    __slots__ = ("left", "total", "deadline", "stopped", "parent", "_lock")

    def __init__(self, steps: int, deadline: float | None = None, parent: Work | None = None) -> None:
        self.left = self.total = steps
        self.deadline = deadline
        self.stopped = False
        self.parent = parent
        self._lock = threading.Lock()

    def share(self) -> Work:
        """A view drawing from this budget that can be stopped on its own: one check, which its caller may
        abandon (cancelled) while the request's other checks, and later attempts, go on."""
        return Work(0, self.deadline, parent=self)

    def draw(self, want: int) -> int:
        """Up to `want` evaluations; WorkExhausted when none are left, the deadline passed or it was stopped."""
        if self.stopped:
            raise WorkExhausted("the request ended before its answer was checked")
        if self.parent is not None:
            return self.parent.draw(want)
        if self.deadline is not None and time.monotonic() >= self.deadline:
            raise WorkExhausted("the request's deadline passed while its answer was checked", deadline=True)
        with self._lock:
            got = min(want, self.left)
            self.left -= got
        if got <= 0:
            raise WorkExhausted(
                f"checking the request's answers took more than the gateway's bound of {self.total} evaluations"
            )
        return got

    def charge(self, steps: int) -> None:
        """Spend `steps` at once (a regex match, priced by `match_steps`), or WorkExhausted."""
        while steps > 0:
            steps -= self.draw(steps)

    def give_back(self, steps: int) -> None:
        if self.parent is not None:
            self.parent.give_back(steps)
            return
        with self._lock:
            self.left += steps

    def stop(self) -> None:
        self.stopped = True


# Keywords whose value is a schema, a list of schemas, or a map of names to schemas (every draft).
_ONE = frozenset(
    {
        "additionalItems",
        "additionalProperties",
        "contains",
        "propertyNames",
        "not",
        "if",
        "then",
        "else",
        "unevaluatedItems",
        "unevaluatedProperties",
        "contentSchema",
        "items",
    }
)
_MANY = frozenset({"allOf", "anyOf", "oneOf", "prefixItems", "items"})
_MAP = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas", "dependencies"})
# Applied to the same instance: a cycle made only of these (and `$ref`) never ends.
_IN_PLACE = frozenset({"allOf", "anyOf", "oneOf", "not", "if", "then", "else", "dependentSchemas", "dependencies"})
# They move the base a `$ref` resolves against (possibly to a remote document) or resolve dynamically.
_REFUSED = ("$id", "$anchor", "$dynamicAnchor", "$dynamicRef", "$recursiveRef", "$recursiveAnchor")


def _bad(param: str, message: str) -> InvalidRequestError:
    return InvalidRequestError(f"'{param}' {message}", param=param, code="invalid_value")


def depth_exceeds(value: Any, limit: int) -> bool:
    """Whether a decoded JSON value nests more than `limit` levels (iterative: no recursion to exhaust)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, level = stack.pop()
        if isinstance(node, dict):
            children: Any = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        if level > limit:
            return True
        stack.extend((child, level + 1) for child in children if isinstance(child, (dict, list)))
    return False


def _pointer(root: Any, ref: str, param: str) -> Any:
    """The subschema a local `$ref` (`#` or `#/a/b`) names."""
    if ref in ("#", ""):
        return root
    if not ref.startswith("#/"):
        raise _bad(param, f"has a $ref the gateway does not follow ({ref[:100]!r}): only '#' and '#/...' pointers")
    node = root
    for raw in ref[2:].split("/"):
        part = unquote(raw).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        # ASCII and short: `int` refuses other scripts' digits ("²") and more than 4,300 of them (a 500).
        elif isinstance(node, list) and part.isascii() and part.isdigit() and len(part) < 19 and int(part) < len(node):
            node = node[int(part)]
        else:
            raise _bad(param, f"has a $ref that points nowhere in the schema ({ref[:100]!r})")
    return node


def _children(node: Mapping[str, Any]) -> Iterator[tuple[str, Any]]:
    """(keyword, subschema) for every subschema directly under `node`."""
    for key, value in node.items():
        if key in _ONE and isinstance(value, (dict, bool)):
            yield key, value
        if key in _MANY and isinstance(value, list):
            for item in value:
                yield key, item
        if key in _MAP and isinstance(value, dict):
            for item in value.values():
                yield key, item


def _walk(schema: dict[str, Any], param: str, legacy_id: bool, paths: int) -> tuple[list[str], int]:
    """Check a schema's structure; return its patterns and subschemas. Iterative, each node once."""
    patterns: list[str] = []
    seen: dict[int, Any] = {}
    in_place: dict[int, list[int]] = {}
    todo: list[Any] = [schema]
    while todo:
        node = todo.pop()
        if id(node) in seen or not isinstance(node, dict):
            continue
        seen[id(node)] = node
        if len(seen) > ADMIT_WORK:
            raise _bad(param, f"is too large for the gateway to check (more than {ADMIT_WORK} subschemas)")
        for key in _REFUSED:
            if key in node:
                raise _bad(param, f"uses '{key}', which the gateway does not support in a schema it checks")
        if node is not schema and "$schema" in node:
            raise _bad(param, "names a '$schema' below its root, which the gateway does not support")
        if legacy_id and isinstance(node.get("id"), str):
            raise _bad(param, "uses 'id', which the gateway does not support in a schema it checks")
        edges = in_place[id(node)] = []
        ref = node.get("$ref")
        if ref is not None:
            if not isinstance(ref, str):
                raise _bad(param, "has a $ref that is not a string")
            target = _pointer(schema, ref, param)
            edges.append(id(target))
            todo.append(target)
        pattern = node.get("pattern")
        if isinstance(pattern, str):
            patterns.append(pattern)
        props = node.get("patternProperties")
        if isinstance(props, dict):
            patterns.extend(props)
        for key, child in _children(node):
            if key in _IN_PLACE:
                edges.append(id(child))
            todo.append(child)
    nodes = seen.values()
    if any("patternProperties" in n for n in nodes) and any("unevaluatedProperties" in n for n in nodes):
        # jsonschema evaluates that pair with Python's re, outside the keywords replaced below.
        raise _bad(param, "combines 'unevaluatedProperties' with 'patternProperties', which the gateway cannot check")
    _refuse_cycles(in_place, param)
    most = _most_paths(in_place, paths)
    if most > paths:
        raise _bad(
            param,
            f"has more than {paths} ways through its '$ref', 'anyOf', 'allOf', 'oneOf', 'not' and 'if' branches "
            "for one value, which the gateway would have to check every answer against",
        )
    return patterns, len(seen)


def _most_paths(edges: dict[int, list[int]], cap: int) -> int:
    """The most subschemas one value can be checked against through in-place branches and `$ref`s, from any
    subschema (at most `cap` + 1): shared `$ref` targets multiply, so a few lines can make 2^30 of them."""
    count: dict[int, int] = {}
    most = 1
    for start in edges:
        if start in count:
            continue
        stack = [start]
        while stack:  # post-order over a graph already known to have no cycle
            node = stack[-1]
            if node in count:
                stack.pop()
                continue
            todo = [c for c in edges.get(node, ()) if c not in count]
            if todo:
                stack.extend(todo)
                continue
            stack.pop()
            count[node] = total = min(cap + 1, 1 + sum(count[c] for c in edges.get(node, ())))
            most = max(most, total)
    return most


def _refuse_cycles(edges: dict[int, list[int]], param: str) -> None:
    """A loop of `$ref`/`allOf`/`anyOf`/... edges applies the schema to the same value forever."""
    state: dict[int, int] = {}  # 1: on the current path, 2: done
    for start in edges:
        if start in state:
            continue
        stack: list[tuple[int, Iterator[int]]] = [(start, iter(edges.get(start, ())))]
        state[start] = 1
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                state[node] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                raise _bad(param, "refers to itself through '$ref' without descending into the value (it never ends)")
            elif nxt not in state:
                state[nxt] = 1
                stack.append((nxt, iter(edges.get(nxt, ()))))


# --------------------------------------------------------------------------------------------------
# The validator: jsonschema's, with RE2 for patterns and a count of keyword evaluations


class _Exhausted(Exception):
    """The value needs more keyword evaluations than its budget to check."""


class _Meter:
    """One check's evaluations in hand, drawn from its request's `Work` a batch at a time."""

    __slots__ = ("left", "work")

    def __init__(self, work: Work) -> None:
        self.left = 0
        self.work = work

    def spend(self) -> None:
        if self.left <= 0:
            # Give the GIL away between batches: the event loop (and /health) waits at most one batch.
            time.sleep(0)
            self.left = self.work.draw(_DRAW)
        self.left -= 1


_work: ContextVar[_Meter] = ContextVar("client_schema_work")
# The patterns of the schema being checked, compiled when it was admitted.
_patterns: ContextVar[Mapping[str, Any]] = ContextVar("client_schema_patterns", default=MappingProxyType({}))

Keyword = Callable[[Any, Any, Any, Any], Any]


def _counted(fn: Keyword) -> Keyword:
    def keyword(validator: Any, value: Any, instance: Any, schema: Any) -> Any:
        meter = _work.get()
        if meter.left > 0:
            meter.left -= 1
        else:
            meter.spend()
        return fn(validator, value, instance, schema)

    return keyword


def _search(pattern: str, text: str) -> bool:
    rx = _patterns.get().get(pattern) or compiled(pattern)
    if not affordable(rx, text):
        raise _Exhausted
    steps = match_steps(rx, text)
    if steps:
        _work.get().work.charge(steps)
    return rx.search(text) is not None


def _pattern(validator: Any, pattern: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string") and not _search(pattern, instance):
        yield ValidationError(f"a string does not match the pattern {pattern[:100]!r}")


def _pattern_properties(validator: Any, patterns: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            if _search(pattern, key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional_properties(validator: Any, extra: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    known = schema.get("properties", {})
    patterns = schema.get("patternProperties", {})
    extras = [k for k in instance if k not in known and not any(_search(p, k) for p in patterns)]
    if validator.is_type(extra, "object"):
        for key in extras:
            yield from validator.descend(instance[key], extra, path=key)
    elif not extra and extras:
        yield ValidationError(f"additional properties are not allowed ({', '.join(map(repr, sorted(extras)[:5]))})")


def _key(value: Any) -> Any:
    """A hashable stand-in equal where JSON values are equal (1 == 1.0, but true != 1)."""
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, dict):
        return ("object", frozenset((k, _key(v)) for k, v in value.items()))
    if isinstance(value, list):
        return ("array", tuple(_key(v) for v in value))
    return value


def _unique_items(validator: Any, unique: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
    # jsonschema compares unsortable items pairwise: quadratic in an array the answer chooses.
    if unique and validator.is_type(instance, "array") and len({_key(v) for v in instance}) < len(instance):
        yield ValidationError("an array has non-unique elements")


_REPLACED: dict[str, Keyword] = {
    "uniqueItems": _unique_items,
    "pattern": _pattern,
    "patternProperties": _pattern_properties,
    "additionalProperties": _additional_properties,
}
_classes: dict[type[Any], type[Any]] = {}
_EMPTY: referencing.Registry[Any] = referencing.Registry()


def _bounded(cls: type[Any]) -> type[Any]:
    """`cls` with RE2 pattern keywords, every keyword evaluation counted (one class per draft)."""
    found = _classes.get(cls)
    if found is None:
        keywords = {k: _counted(_REPLACED.get(k, fn)) for k, fn in cls.VALIDATORS.items()}
        found = _classes[cls] = extend(cls, keywords)  # type: ignore[no-untyped-call]
    return found


def _first_error(validator: Any, instance: Any, work: Work, patterns: dict[str, Any] | None = None) -> str | None:
    """Why `instance` fails (None when it passes), within what `work` has left."""
    meter = _Meter(work)
    token = _work.set(meter)
    known = _patterns.set(patterns or MappingProxyType({}))
    try:
        error = next(iter(validator.iter_errors(instance)), None)
    finally:
        _patterns.reset(known)
        _work.reset(token)
        if meter.left > 0:
            work.give_back(meter.left)
    return None if error is None else str(error.message)[:300]


class Checker:
    """An admitted schema: `why(value)` says why a decoded answer fails it, or None.

    Until `ready`, `finish` has still to check it against its meta-schema and compile its patterns (a 400
    naming the field), off the event loop: `admit` does that itself only for a small schema."""

    def __init__(self, schema: dict[str, Any], cls: Any, param: str, depth: int, pattern_chars: int) -> None:
        self._schema, self._cls, self._param, self._pattern_chars = schema, cls, param, pattern_chars
        self._validator: Any = None
        self._depth = depth
        self._patterns: dict[str, Any] = {}
        self.sources: list[str] = []
        self.ready = False

    def finish(self) -> None:
        param, schema, cls = self._param, self._schema, self._cls
        self._patterns = compile_all(self.sources, param=param, limit=self._pattern_chars)
        meta_cls = cls if cls in _METAS else Draft7Validator
        meta = _bounded(meta_cls)(_METAS[meta_cls], format_checker=None, registry=_EMPTY)
        try:
            problem = _first_error(meta, schema, Work(ADMIT_WORK))
        except (_Exhausted, WorkExhausted):
            raise _bad(param, f"is too large for the gateway to check (more than {ADMIT_WORK} evaluations)") from None
        except RecursionError:
            raise _bad(param, "is nested too deeply for the gateway to check") from None
        if problem is not None:
            raise _bad(param, f"is not a valid JSON Schema: {problem}")
        # An empty registry: a reference the walk missed fails instead of being fetched from the network.
        self._validator = _bounded(cls)(_without_base(schema), format_checker=None, registry=_EMPTY)
        self.ready = True

    def why(self, value: Any, work: Work) -> str | None:
        """Raises WorkExhausted when the request's budget or deadline runs out first."""
        if depth_exceeds(value, self._depth):
            return f"nests deeper than {self._depth} levels"
        try:
            error = _first_error(self._validator, value, work, self._patterns)
        except WorkExhausted:
            raise
        except _Exhausted:
            return "is too long to check against a pattern of the schema within the gateway's bound"
        except RecursionError:
            return "is nested too deeply to check against the schema"
        except Exception as exc:  # noqa: BLE001 - a schema keyword jsonschema cannot apply: no answer is vouched for
            return f"cannot be checked against the schema ({type(exc).__name__})"
        return None if error is None else f"does not match the schema ({error})"


def _without_base(schema: Mapping[str, Any]) -> dict[str, Any]:
    """A root without `$schema`/`$id`: jsonschema switches to the stock (unbounded, `re`) class at a
    subschema naming its dialect, including the root reached again through `$ref: "#"`."""
    return {k: v for k, v in schema.items() if k not in ("$schema", "$id")}


# Meta-schemas as roots of their own, so the bounded class stays in charge (see `_without_base`); 2019-09
# and 2020-12 schemas are checked against draft 7's, which says what shape every keyword's value must
# have, at a fifth of the cost of the 2020-12 vocabularies.
_METAS = {cls: _without_base(cls.META_SCHEMA) for cls in (Draft4Validator, Draft6Validator, Draft7Validator)}


def admit(schema: dict[str, Any], *, param: str, depth: int, pattern_chars: int, paths: int = 1000) -> Checker:
    """Check a client's schema before any upstream call (400 naming `param`); the checker for its answers."""
    if depth_exceeds(schema, depth):
        raise _bad(param, f"nests deeper than {depth} levels")
    dialect = schema.get("$schema")
    if dialect is not None and not isinstance(dialect, str):
        # jsonschema looks the dialect up by value and expects a URI: anything else fails inside it.
        raise _bad(param, "has a `$schema` that is not a string")
    cls = validator_for(schema, default=Draft202012Validator)
    if cls is Draft3Validator:
        raise _bad(param, "uses JSON Schema draft 3, which the gateway does not check")
    checker = Checker(schema, cls, param, depth, pattern_chars)
    checker.sources, nodes = _walk(schema, param, legacy_id=cls is Draft4Validator, paths=paths)
    if nodes <= LOOP_NODES and sum(map(len, checker.sources)) <= LOOP_PATTERN_CHARS:
        checker.finish()
    return checker


__all__ = ["ADMIT_WORK", "Checker", "Work", "WorkExhausted", "admit", "depth_exceeds", "match_steps"]
