"""The token ids a request sends: its prompt's, and its lists of ids beside it, and how many it may send.

The decoder has already held every id to a non-negative (or, in `prompt`, any) 64-bit integer and refused
booleans, floats and nulls; what is left is the shape of a prompt list and the counts. The upstream reads
every id it is sent and nothing but the body bounded these lists: one tenant's 8 MiB of ids (about
4 million) would keep a shared server's front end busy. Bounds: docs/security.md#caps-and-their-defaults.
"""

from __future__ import annotations

from typing import Any

from wire.errors import InvalidRequestError
from wire.schema import CompletionRequest


def _bad(message: str, param: str) -> InvalidRequestError:
    return InvalidRequestError(message, param=param, code="invalid_value")


def check_prompt(prompt: list[Any], most_ids: int, most_prompts: int) -> int:
    """Return the number of prompts of a list `prompt`; reject empty and mixed lists, negative ids, and more
    than `most_ids` token ids in all (`caps.prompt_token_ids`).

    A body of 8 MiB holds millions of token ids: the checks run in C (`map`, `set`, `min`, `sum`), and a list
    of more than `most_prompts` prompts is counted, not inspected (normalize refuses it).
    """
    if not prompt:
        raise _bad("'prompt' must not be an empty list", "prompt")
    # The decoder yields only str, int and list[int] items (never bool), so one type means one form.
    kinds = set(map(type, prompt))
    if len(kinds) != 1:
        raise _bad(
            "'prompt' must be a string, a list of strings, a list of token ids or a list of token-id lists",
            "prompt",
        )
    kind = kinds.pop()
    if kind is int:
        _check_count(len(prompt), most_ids)
        if min(prompt) < 0:
            raise _bad("'prompt' token ids must be non-negative", "prompt")
        return 1
    if kind is list and len(prompt) <= most_prompts:
        if not all(prompt):
            raise _bad("'prompt' token-id lists must not be empty", "prompt")
        _check_count(sum(map(len, prompt)), most_ids)
        if min(map(min, prompt)) < 0:
            raise _bad("'prompt' token ids must be non-negative", "prompt")
    return len(prompt)


def _check_count(count: int, most: int) -> None:
    if count > most:
        raise _bad(
            f"'prompt' holds {count} token ids; at most {most} may be sent in one request (caps.prompt_token_ids)",
            "prompt",
        )


def check_id_lists(req: CompletionRequest, most: int) -> None:
    """Refuse a `stop_token_ids` or `allowed_token_ids` of more than `most` ids, or a `logit_bias` of more
    than `most` entries (`caps.param_token_ids`): each names a token of the vocabulary, so no more than a
    vocabulary holds are of use."""
    for name in ("stop_token_ids", "allowed_token_ids", "logit_bias"):
        value = getattr(req, name)
        if value is not None and len(value) > most:
            what = "entries" if name == "logit_bias" else "token ids"
            raise _bad(f"'{name}' holds {len(value)} {what}; at most {most} may be sent (caps.param_token_ids)", name)


__all__ = ["check_id_lists", "check_prompt"]
