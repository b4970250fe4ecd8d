"""What a chat request sends upstream beside its rendered conversation, gathered once for token counts.

`wire.chat.render` keeps the messages' text (prefix affinity and prompt logging read it). Providers bill what
goes beside it as prompt too: tool definitions, structured-output schemas, thinking sent back, images.
`unrendered` gathers their text, as it is sent, and the image parts' allowance (`caps.image_tokens` each),
so that token limits, budgets and usage estimates count the whole request
(docs/ratelimits.md#what-a-chat-request-counts).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Final

import msgspec

from wire.chat import AssistantMessage, ChatRequest, ImagePart, ThinkingBlock
from wire.schema import Unrendered

# The request's fields beside its messages that can carry text of any length to the upstream: the tools and
# the choice of one, the structured-output constraints (a server may write a schema into the prompt), the
# predicted output (billed where it is not used), a template's variables (rendered into the prompt: RAG
# `documents`) and the escape hatch's fields (merged into the body).
_BESIDE: Final = (
    "tools",
    "tool_choice",
    "response_format",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "prediction",
    "chat_template_kwargs",
    "inference_extra_params",
)
_beside: Final = operator.attrgetter(*_BESIDE)
_NONE_BESIDE: Final = (None,) * len(_BESIDE)
_encode: Final = msgspec.json.encode


def image_parts(content: Sequence[object]) -> int:
    """The image parts of a user message's content list."""
    return sum(p.__class__ is ImagePart for p in content)


def _said_back(m: AssistantMessage) -> list[str]:
    """The text of an assistant message that `render` leaves out: its thinking and its refusal."""
    said = [] if m.reasoning_content is None else [m.reasoning_content]
    for block in m.thinking_blocks or ():
        said.append(block.thinking if isinstance(block, ThinkingBlock) else block.data)
    if m.refusal is not None:
        said.append(m.refusal)
    return said


def unrendered(req: ChatRequest, images: int, image_tokens: int, said_back: bool) -> Unrendered | None:
    """What `req` sends beside its rendered messages: None for messages of text alone and none of the fields
    (the common request: one C call). `images`: its image parts; `said_back`: an assistant message carries
    thinking or a refusal (both found by normalize_chat's one look at each message)."""
    fields = _beside(req)
    if fields == _NONE_BESIDE and not images and not said_back:
        return None
    texts = [_encode(value).decode() for value in fields if value is not None]
    if said_back:
        for m in req.messages:
            if isinstance(m, AssistantMessage):
                texts += _said_back(m)
    return Unrendered("\n".join(texts), images * image_tokens)


__all__ = ["image_parts", "unrendered"]
