"""What a request sends upstream beside its prompt text, gathered once for token counts.

A completion's `prompt` is its text; a chat's is its conversation as `wire.messages.render` writes it (prefix
affinity and prompt logging read it). Providers bill what goes beside it as prompt too: tool definitions,
structured-output schemas, a completion's suffix, thinking sent back, images. `unrendered` gathers their
text, as it is sent, and the images' allowance (`caps.image_tokens` each), so that token limits, budgets,
the fair queue and usage estimates count the whole request (docs/ratelimits.md#what-a-request-counts).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Final

import msgspec

from gateway.limits.tokens import BYTES_PER_TOKEN
from wire.chat import ChatRequest
from wire.messages import AssistantMessage, ImagePart, Message, ThinkingBlock, ToolMessage
from wire.schema import CompletionRequest, Unrendered

# A chat's fields beside its messages that can carry text of any length to the upstream: the tools and the
# choice of one, the structured-output constraints (a server may write a schema into the prompt), the
# predicted output (billed where it is not used), a template's variables (rendered into the prompt: RAG
# `documents`), the web search's options and the escape hatch's fields (merged into the body).
_CHAT: Final = (
    "tools",
    "tool_choice",
    "response_format",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "prediction",
    "chat_template_kwargs",
    "web_search_options",
    "inference_extra_params",
)
# A completion's: the same but the template's variables and the web search's options, which no completion
# route sends. Its `suffix`, the text its answer ends before, is read beside them: prompt text.
_COMPLETION: Final = tuple(name for name in _CHAT if name not in ("chat_template_kwargs", "web_search_options"))
_BESIDE: Final = {
    ChatRequest: (operator.attrgetter(*_CHAT), (None,) * len(_CHAT), _CHAT),
    CompletionRequest: (operator.attrgetter(*_COMPLETION), (None,) * len(_COMPLETION), _COMPLETION),
}
_encode: Final = msgspec.json.encode
# A chat's fields beside its messages, and their values when none is set (`unrendered` returns None then, as
# it does without images or thinking sent back): for gateway/path/chat_request.py's test of the common request.
chat_beside: Final = _BESIDE[ChatRequest][0]
NOTHING_BESIDE: Final = _BESIDE[ChatRequest][1]


def image_parts(content: Sequence[object]) -> int:
    """The image parts of a user message's content list."""
    return sum(p.__class__ is ImagePart for p in content)


def _said_back(m: Message) -> list[str]:
    """The text of a message that `render` leaves out: an assistant message's thinking, refusal and tool-call
    ids, a tool result's `tool_call_id` (chat templates write ids into the prompt, and an id has no bound of
    its own: Gemini's signed ones carry a thought signature)."""
    if isinstance(m, ToolMessage):
        return [m.tool_call_id]
    if not isinstance(m, AssistantMessage):
        return []
    said = [] if m.reasoning_content is None else [m.reasoning_content]
    for block in m.thinking_blocks or ():
        said.append(block.thinking if isinstance(block, ThinkingBlock) else block.data)
    if m.refusal is not None:
        said.append(m.refusal)
    said.extend(call.id for call in m.tool_calls or ())
    return said


def unrendered(req: CompletionRequest, images: int, image_tokens: int, said_back: bool = False) -> Unrendered | None:
    """What `req` sends beside its prompt text: None when it sends none of the fields, no suffix and no image or
    thinking (the common request: one C call). `images`: its images (a chat's image parts, a completion's `images`);
    `said_back`: a message carries thinking, a refusal or tool-call ids (found by normalize_chat's one look at
    each message)."""
    beside, none, names = _BESIDE[req.__class__]
    fields = beside(req)
    suffix = req.suffix  # a chat's is refused by normalize_chat before
    if fields == none and suffix is None and not images and not said_back:
        return None
    texts: list[str] = []
    # Per field, its share in tokens by the bytes estimate: enough to say which one weighs most.
    weights: dict[str, int] = {}
    for name, value in zip(names, fields, strict=True):
        if value is not None:
            texts.append(_encode(value).decode())
            weights[name] = len(texts[-1]) // BYTES_PER_TOKEN
    if suffix is not None:
        texts.append(suffix)
        weights["suffix"] = len(suffix) // BYTES_PER_TOKEN
    chat = isinstance(req, ChatRequest)
    if said_back and isinstance(req, ChatRequest):
        for m in req.messages:
            for said in _said_back(m):
                texts.append(said)
                weights["messages"] = weights.get("messages", 0) + len(said) // BYTES_PER_TOKEN
    if images:  # a chat's image parts are in its messages, a completion's in its `images`
        where = "messages" if chat else "images"
        weights[where] = weights.get(where, 0) + images * image_tokens
    largest = max(weights, key=weights.__getitem__, default="")
    return Unrendered("\n".join(texts), images * image_tokens, largest)


__all__ = ["NOTHING_BESIDE", "chat_beside", "image_parts", "unrendered"]
