"""JSON Schemas chosen by clients (`guided_json`, `response_format`), admitted once and checked within bounds.

Plain `jsonschema` would let a schema backtrack, fetch a remote `$ref` or recurse without end, so `admit`
(a 400 naming the field otherwise) walks and compiles a schema within bounds before any upstream call,
and each answer is checked with RE2, no network and a work cap. The rules: docs/security.md (item 3).
"""

from __future__ import annotations

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
# meta-schema takes about 50, so a few hundred subschemas fit. Checking one answer (in a worker thread)
# may take ANSWER_WORK, about 1 s: e.g. a few thousand array items against a handful of keywords each.
ADMIT_WORK = 20_000
ANSWER_WORK = 100_000

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
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
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


def _walk(schema: dict[str, Any], param: str, legacy_id: bool) -> list[str]:
    """Check a schema's structure; return its patterns. Iterative, each node once (`$ref` targets too)."""
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
    return patterns


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


_work: ContextVar[list[int]] = ContextVar("client_schema_work")
# The patterns of the schema being checked, compiled when it was admitted.
_patterns: ContextVar[Mapping[str, Any]] = ContextVar("client_schema_patterns", default=MappingProxyType({}))

Keyword = Callable[[Any, Any, Any, Any], Any]


def _counted(fn: Keyword) -> Keyword:
    def keyword(validator: Any, value: Any, instance: Any, schema: Any) -> Any:
        left = _work.get()
        left[0] -= 1
        if left[0] < 0:
            raise _Exhausted
        return fn(validator, value, instance, schema)

    return keyword


def _search(pattern: str, text: str) -> bool:
    rx = _patterns.get().get(pattern) or compiled(pattern)
    if not affordable(rx, text):
        raise _Exhausted
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


def _first_error(validator: Any, instance: Any, budget: int, patterns: dict[str, Any] | None = None) -> str | None:
    """Why `instance` fails (None when it passes), within `budget` keyword evaluations."""
    token = _work.set([budget])
    known = _patterns.set(patterns or MappingProxyType({}))
    try:
        error = next(iter(validator.iter_errors(instance)), None)
    finally:
        _patterns.reset(known)
        _work.reset(token)
    return None if error is None else str(error.message)[:300]


class Checker:
    """An admitted schema: `why(value)` says why a decoded answer fails it, or None."""

    def __init__(self, validator: Any, depth: int, patterns: dict[str, Any]) -> None:
        self._validator = validator
        self._depth = depth
        self._patterns = patterns

    def why(self, value: Any) -> str | None:
        if depth_exceeds(value, self._depth):
            return f"nests deeper than {self._depth} levels"
        try:
            error = _first_error(self._validator, value, ANSWER_WORK, self._patterns)
        except _Exhausted:
            return f"is too large to check against the schema within the gateway's bound ({ANSWER_WORK} evaluations)"
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


def admit(schema: dict[str, Any], *, param: str, depth: int, pattern_chars: int) -> Checker:
    """Check a client's schema before any upstream call (400 naming `param`); the checker for its answers."""
    if depth_exceeds(schema, depth):
        raise _bad(param, f"nests deeper than {depth} levels")
    cls = validator_for(schema, default=Draft202012Validator)
    if cls is Draft3Validator:
        raise _bad(param, "uses JSON Schema draft 3, which the gateway does not check")
    patterns = compile_all(_walk(schema, param, legacy_id=cls is Draft4Validator), param=param, limit=pattern_chars)
    meta_cls = cls if cls in _METAS else Draft7Validator
    meta = _bounded(meta_cls)(_METAS[meta_cls], format_checker=None, registry=_EMPTY)
    try:
        problem = _first_error(meta, schema, ADMIT_WORK)
    except _Exhausted:
        raise _bad(param, f"is too large for the gateway to check (more than {ADMIT_WORK} evaluations)") from None
    except RecursionError:
        raise _bad(param, "is nested too deeply for the gateway to check") from None
    if problem is not None:
        raise _bad(param, f"is not a valid JSON Schema: {problem}")
    # An empty registry: a reference the walk missed fails instead of being fetched from the network.
    validator = _bounded(cls)(_without_base(schema), format_checker=None, registry=_EMPTY)
    return Checker(validator, depth, patterns)


__all__ = ["ADMIT_WORK", "ANSWER_WORK", "Checker", "admit", "depth_exceeds"]
