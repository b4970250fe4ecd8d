"""Which chat fields a kind's chat route takes, and under which name: its `chat_params`.

`chat_table` makes a kind's table from its completion table: OpenAI's chat parameters restricted to the
sampling fields the kind takes at all, plus the vendor sampling fields as its completion table maps them
(vLLM, SGLang, llama.cpp and the hosted engines read them under the same names on both routes), plus chat's
own (`tools`, `tool_choice`, `parallel_tool_calls`, `response_format`). Kinds whose chat body is their own
(Anthropic, Gemini, Bedrock, Cohere) write their tables by hand and pass them through `guides_checked`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Literal

from providers.base import EMULATED, Param, Table, table

# Where the kind's engine reads the token limit, the choice count and the conversation on chat: what the
# client's `inference_extra_params` may not overwrite.
CHAT_GUARDED: Final = frozenset({"messages", "max_tokens", "max_completion_tokens", "n"})


def _logprobs(body: dict[str, Any], count: int) -> None:
    # normalize() folded `logprobs: true` + `top_logprobs: k` into the count k.
    body["logprobs"] = True
    if count:
        body["top_logprobs"] = count


# OpenAI's chat parameters (openai-python `chat/completion_create_params.py`) the gateway translates.
OPENAI_CHAT_PARAMS: Final[Table] = table(
    max_tokens=Param(),
    temperature=Param(),
    top_p=Param(),
    n=Param(),
    stop=Param(),
    seed=Param(),
    logit_bias=Param(),
    frequency_penalty=Param(),
    presence_penalty=Param(),
    user=Param(),
    logprobs=Param(apply=_logprobs),
    response_format=Param(),
    tools=Param(),
    tool_choice=Param(),
    parallel_tool_calls=Param(),
)
_CHAT_OWN: Final = frozenset({"response_format", "tools", "tool_choice", "parallel_tool_calls"})
# Completion fields that are not chat's (the prompt's own), and vendor fields whose answer the chat shape
# does not carry (token ids, stop reasons, prompt logprobs).
_NOT_CHAT: Final = frozenset(
    {
        "echo",
        "best_of",
        "suffix",
        "images",
        "context_length_exceeded_behavior",
        "return_token_ids",
        "include_stop_reason",
        "prompt_logprobs",
    }
)


_GUIDED: Final = ("guided_json", "guided_regex", "guided_choice", "guided_grammar")


class ToolsParam(Param, frozen=True):
    """`tools` for a kind that writes them its own way, with which of a function's `strict: true` (the answer's
    arguments held to the function's schema) its body can carry: `each` (a flag per function), `all` (one
    flag for the whole request, so only when every function asks it) or `none`."""

    strict: Literal["each", "all", "none"] = "each"


STRICT: Final = "tools.function.strict"


def strict_unhonoured(tools: list[dict[str, Any]] | None, rule: Param | None) -> bool:
    """Whether `tools` ask `strict: true` of a function where the kind's `tools` rule cannot carry it (an
    OpenAI-wire kind's plain rule sends the tools as they came): for the route to refuse or drop, never
    to leave out unsaid, since the client relies on the arguments matching the schema."""
    if not tools or rule is None:
        return False
    how = rule.strict if isinstance(rule, ToolsParam) else "each"
    if how == "each":
        return False
    asked = [t["function"].get("strict") is True for t in tools]
    return any(asked) and (how == "none" or not all(asked))


def continuing(fields: Mapping[str, Any]) -> Param:
    """`continue_final_message` on a chat route that continues a trailing assistant message when its body
    carries `fields` (its `chat_continue`)."""

    def apply(body: dict[str, Any], value: bool) -> None:
        if value:
            body.update(fields)

    return Param(apply=apply)


def guides_checked(chat: Table, completions: Table) -> dict[str, Param]:
    """A chat table with the gateway's check of each guided field the kind's completion route has checked
    rather than decoded (`EMULATED` there): on chat too the gateway checks the answer's content and asks
    again (gateway/emulation/chat.py), and refuses a grammar, which it cannot check."""
    out = dict(chat)
    for name in _GUIDED:
        rule = completions.get(name)
        if name not in out and rule is not None and rule.emulated:
            out[name] = EMULATED
    return table(out)


def chat_table(
    completions: Table, *, native: bool = True, drop: tuple[str, ...] = (), **extra: Param
) -> dict[str, Param]:
    """A kind's chat table from its completion table (module docstring): `native=False` for a kind whose
    completion table writes its vendor fields into a native body (TGI's `parameters`, Ollama's `options`)
    that its OpenAI-compatible chat route does not read."""
    out = {
        name: rule
        for name, rule in OPENAI_CHAT_PARAMS.items()
        if (name in _CHAT_OWN or (name in completions and not completions[name].emulated)) and name not in drop
    }
    if native:
        for name, rule in completions.items():
            if name not in OPENAI_CHAT_PARAMS and name not in _NOT_CHAT and not rule.emulated and name not in drop:
                out[name] = rule
    out.update(extra)
    # A chat route without `n` gets it from the gateway: one call per choice (gateway/emulation/chat.py).
    out.setdefault("n", EMULATED)
    return guides_checked(out, completions)


__all__ = [
    "CHAT_GUARDED",
    "OPENAI_CHAT_PARAMS",
    "STRICT",
    "ToolsParam",
    "chat_table",
    "continuing",
    "guides_checked",
    "strict_unhonoured",
]
