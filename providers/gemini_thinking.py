"""`reasoning_effort` as Gemini's `generationConfig.thinkingConfig` (providers/gemini.py sends it).

Google's own mapping, from its OpenAI-compatibility layer (ai.google.dev/gemini-api/docs/openai#thinking):
Gemini 3 models take `thinkingLevel`, Gemini 2.5 and earlier `thinkingBudget` (1,024, 8,192, 24,576
tokens; `none` is a budget of 0). Which applies is read from the endpoint's model name. A value with no
documented mapping (xhigh, max; none where thinking cannot be turned off) is a 400 naming the field, and
so is a request whose `inference_extra_params` already set the level or the budget: Google refuses both.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from providers.base import Endpoint
from wire.errors import InvalidRequestError, UnsupportedParamError, shown

FIELD: Final = "reasoning_effort"

# Gemini 2.5 (and every model not named gemini-3*): a token budget.
BUDGETS: Final[Mapping[str, int]] = {"none": 0, "minimal": 1024, "low": 1024, "medium": 8192, "high": 24576}
# Gemini 3: a level. The Pro models take only low and high, to which Google folds the others.
LEVELS: Final[Mapping[str, str]] = {"minimal": "minimal", "low": "low", "medium": "medium", "high": "high"}
PRO_LEVELS: Final[Mapping[str, str]] = {"minimal": "low", "low": "low", "medium": "high", "high": "high"}


def _spelling(key: str) -> str:
    # Google's JSON reads snake_case for lowerCamelCase: `thinking_config` is `thinkingConfig`.
    return key.lower().replace("_", "")


def _child(node: dict[str, Any], name: str) -> dict[str, Any]:
    """`node`'s object under any spelling of `name` (the client's extras may have written it), or a new one."""
    for key, value in node.items():
        if _spelling(key) == name.lower() and isinstance(value, dict):
            return value
    made: dict[str, Any] = {}
    node[name] = made
    return made


def _refuse(effort: str, endpoint: Endpoint, why: str) -> UnsupportedParamError:
    return UnsupportedParamError(
        FIELD,
        endpoint.provider,
        f"Provider '{endpoint.provider}' cannot take reasoning_effort '{effort}' for model '{shown(endpoint.model)}': "
        f"{why} (Google's mapping: ai.google.dev/gemini-api/docs/openai#thinking)",
    )


def thinking_config(effort: str, endpoint: Endpoint) -> dict[str, Any]:
    """The `thinkingConfig` fields that `effort` stands for on the endpoint's model."""
    model = endpoint.model.removeprefix("models/").lower()
    if model.startswith("gemini-3"):
        if effort == "none":
            raise _refuse(effort, endpoint, "Gemini 3 models cannot turn thinking off")
        levels = PRO_LEVELS if "-pro" in model else LEVELS
        if effort not in levels:
            raise _refuse(effort, endpoint, "Gemini 3 takes minimal, low, medium or high")
        return {"thinkingLevel": levels[effort]}
    if effort == "none" and model.startswith("gemini-2.5-pro"):
        raise _refuse(effort, endpoint, "Gemini 2.5 Pro cannot turn thinking off")
    if effort not in BUDGETS:
        raise _refuse(effort, endpoint, "Gemini 2.5 takes none, minimal, low, medium or high")
    return {"thinkingBudget": BUDGETS[effort]}


def add_thinking(body: dict[str, Any], effort: str, endpoint: Endpoint) -> None:
    """Merge `effort`'s thinking fields into the body's `thinkingConfig`, keeping what the client's extras
    put there (`includeThoughts`), after those extras are merged: the merge would replace the whole object."""
    fields = thinking_config(effort, endpoint)
    config = _child(_child(body, "generationConfig"), "thinkingConfig")
    for key in config:
        if _spelling(key) in ("thinkinglevel", "thinkingbudget"):
            raise InvalidRequestError(
                f"'{FIELD}' sets Gemini's thinking, which 'inference_extra_params' already sets with '{shown(key)}'; "
                "send one of them",
                param=FIELD,
                code="invalid_value",
            )
    config.update(fields)


def accepted(body: dict[str, Any], effort: str) -> None:
    """The table's rule: the field is taken, and written by `add_thinking` once the model is known."""


__all__ = ["BUDGETS", "LEVELS", "PRO_LEVELS", "accepted", "add_thinking", "thinking_config"]
