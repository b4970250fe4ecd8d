"""The fields of OpenAI's chat messages that an OpenAI-wire route may not carry: a message's `name` (who said
it) and an assistant message's `refusal` (what it said when it declined).

Each route declares which roles' `name` it takes (`OpenAIChat.chat_names`) and whether it reads `refusal`
(`OpenAIChat.chat_refusal`), as its server's request schema has them. A name the route does not take is
refused by name before any call, or left out under `unsupported_params: drop` (gateway/path/chat.py); a
refusal goes as the turn's text, as the kinds with their own bodies send it (providers/chat_parts.py): it is
what the assistant said, and the servers without the field refuse it (Mistral answers 422 to any field its
schema lacks), refuse a `refusal` content part, or read a turn whose content is null as empty.
"""

from __future__ import annotations

from typing import Final

import msgspec

from providers.chat_parts import assistant_text
from wire.messages import AssistantMessage, Message, RefusalPart

# The roles whose messages carry a `name` in OpenAI's chat request (a tool message has none).
NAMED_ROLES: Final = frozenset({"system", "developer", "user", "assistant"})
NO_NAMES: Final = frozenset[str]()


def role(m: Message) -> str:
    return type(m).__struct_config__.tag  # type: ignore[return-value]  # each message struct is tagged by role


def unnamed(messages: list[Message], roles: frozenset[str]) -> int | None:
    """The index of the first message with a `name` the route does not take (its role is not among `roles`),
    or None."""
    for i, m in enumerate(messages):
        if getattr(m, "name", None) is not None and role(m) not in roles:
            return i
    return None


def _refused(m: Message) -> bool:
    """Whether `m` is an assistant message that says a refusal: the field, or a `refusal` content part."""
    if m.__class__ is not AssistantMessage:
        return False
    assert isinstance(m, AssistantMessage)
    content = m.content
    return m.refusal is not None or (
        content.__class__ is list and any(p.__class__ is RefusalPart for p in content or ())
    )


def carried(messages: list[Message], names: frozenset[str], refusal: bool) -> list[Message]:
    """The conversation with what the route does not carry taken out: the names of the roles not in `names`
    (the request was refused before, unless names are dropped), and, without `refusal`, each refusal as its
    turn's text (a string, which every route takes for an assistant turn). The list itself when no message
    has either."""
    out: list[Message] | None = None
    for i, m in enumerate(messages):
        drop_name = getattr(m, "name", None) is not None and role(m) not in names
        fold = not refusal and _refused(m)
        if not (drop_name or fold):
            continue
        if out is None:
            out = list(messages)
        if fold:
            assert isinstance(m, AssistantMessage)
            m = msgspec.structs.replace(m, content=assistant_text(m), refusal=None)
        if drop_name:
            m = msgspec.structs.replace(m, name=None)
        out[i] = m
    return messages if out is None else out


__all__ = ["NAMED_ROLES", "NO_NAMES", "carried", "role", "unnamed"]
