"""vLLM's `echo` on chat, done by the gateway for every route: each choice's content is led by the last
message's text when the answer's role is that message's role.

The answer's role is the assistant's when the template opens a new turn (the default), and the last
message's own when it does not (`continue_final_message`, or `add_generation_prompt: false`). So a
continued assistant message comes back whole, prefill and continuation, and a conversation that ends with a
user message is answered without echo unless the client leaves the turn unopened (vLLM's
`get_chat_request_role`). Buffered, the text leads each choice's `content`; streamed, each choice's first
delta. Usage and logprobs are the generated tokens' alone, as vLLM's are.
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any

import msgspec

from wire.chat import ChatChunk, ChatCompletion, ChatRequest
from wire.messages import AssistantMessage, text_parts


def echoed(req: ChatRequest) -> str:
    """The text `echo` leads each choice's content with ("" for none)."""
    if not req.echo_last:
        return ""
    last = req.messages[-1]
    opened = not (req.continue_final_message or req.add_generation_prompt is False)
    if opened and not isinstance(last, AssistantMessage):
        return ""
    return text_parts(last.content, "\n") or ""  # text parts joined as vLLM joins them for a template


async def led(answer: Coroutine[Any, Any, ChatCompletion], text: str) -> ChatCompletion:
    """The buffered answer, each choice's content led by `text`."""
    done = await answer
    for ch in done.choices:
        ch.message.content = text + (ch.message.content or "")
    return done


class Lead:
    """A stream's chunks with each choice's first delta led by the echoed text (`lead`, chunk by chunk)."""

    __slots__ = ("blank", "done", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        self.done: set[int] = set()  # the choices whose delta carried it
        # Of those deltas, the ones that carried no token of their own (the role's): the relay counts a chunk
        # with text as a token, and a broken stream's continuation must not be one token short.
        self.blank = 0

    def lead(self, c: ChatChunk) -> ChatChunk:
        choices = c.choices
        for i, ch in enumerate(choices):
            if ch.index not in self.done:
                self.done.add(ch.index)
                self.blank += not ch.delta.content and ch.finish_reason is None
                delta = msgspec.structs.replace(ch.delta, content=self.text + (ch.delta.content or ""))
                choices[i] = msgspec.structs.replace(ch, delta=delta)
        return c


def unechoed(req: ChatRequest, text: str) -> str:
    """What a broken stream generated of the `text` it sent: without the echo that led it."""
    lead = echoed(req)
    return text[len(lead) :] if lead and text.startswith(lead) else text


__all__ = ["Lead", "echoed", "led", "unechoed"]
