"""Which upstream body paths the client's `inference_extra_params` may not write (an adapter's `guarded_paths`),
and how the rest merge into the body.

The prompt, the token limit and the choice counts are what admission reserves tokens for and emulation plans
calls from; written through the escape hatch under the provider's own name (llama.cpp's `n_predict: -1`,
TGI's `parameters.max_new_tokens`) they would pass every check made on the request's own fields.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from providers.base import Table

ExtraMerge = Literal["top", "nested", "deep"]


def _spelling(key: str) -> str:
    # Go's encoding/json (Ollama) matches field names case-insensitively and Google's JSON (Gemini) takes
    # snake_case for lowerCamelCase: every such spelling of a guarded key reaches the same field.
    return key.lower().replace("_", "")


@functools.lru_cache(maxsize=64)
def _split(paths: frozenset[str]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    return tuple(sorted((path, tuple(path.split("."))) for path in paths))


def _writes(node: Mapping[str, Any], path: tuple[str, ...], depth: int, how: ExtraMerge) -> bool:
    """Whether merging `node` (a level of the client's extra params) `how` writes or replaces `path`."""
    want = _spelling(path[depth])
    for key, value in node.items():
        if _spelling(key) != want:
            continue
        # The leaf itself; or an object on the way that the merge puts in whole (a value that is not an
        # object, another spelling of the key, or a level `how` does not merge into): either way the field
        # the gateway set is replaced, or dropped.
        descends = how == "deep" or (how == "nested" and depth == 0)
        if depth == len(path) - 1 or key != path[depth] or not isinstance(value, dict) or not descends:
            return True
        if _writes(value, path, depth + 1, how):
            return True
    return False


def guarded_write(extra: Mapping[str, Any], guarded: frozenset[str], how: ExtraMerge) -> str | None:
    """The first of the `guarded` body paths that merging `extra` `how` would write or replace; None if none."""
    for path, parts in _split(guarded):
        if _writes(extra, parts, 0, how):
            return path
    return None


def limit_paths(params: Table) -> set[str]:
    """The body paths a parameter table writes the token limit and the choice counts to (natively mapped
    `max_tokens`, `n`, `best_of`): what an adapter's `guarded_paths` must hold at least."""
    out = set()
    for name in ("max_tokens", "n", "best_of"):
        rule = params.get(name)
        if rule is not None and not rule.emulated and rule.apply is None:
            out.add(rule.to or name)
    return out


def merge_extra(body: dict[str, Any], extra: Mapping[str, Any], how: ExtraMerge) -> None:
    """Merge the client's `inference_extra_params` into an upstream body.

    `top` replaces top-level keys. `nested` extends an object the body already has by one level (Gemini's
    `generationConfig`, Bedrock's `inferenceConfig`), `deep` at every level (TGI's `parameters`, Ollama's
    `options`): a client sending `{"options": {"num_ctx": 8192}}` means to add a knob, not to drop every
    mapped one.
    """
    if how == "top":
        body.update(extra)
        return
    for key, value in extra.items():
        current = body.get(key)
        if isinstance(current, dict) and isinstance(value, dict):
            if how == "deep":
                merge_extra(current, value, how)
            else:
                current.update(value)
        else:
            body[key] = value
