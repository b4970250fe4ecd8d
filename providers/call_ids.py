"""A tool call's id where its provider sent none.

A client answers a call with a tool message naming the call's id (`tool_call_id`), and the gateway refuses
a conversation whose call or tool message has an empty id (gateway/path/chat_request.py), as OpenAI's API does:
so every call the gateway answers carries one. OpenAI, Anthropic, Bedrock, Mistral and Cohere always send
one; Gemini's `functionCall` may come without, and an OpenAI-compatible server may leave `id` out or empty.
The made id is the answer's own id (unique per request) with the choice's index in the answer and the call's
place in it: unique across the choices of one answer, those of a fan-out's calls included (each call's
context says which choice its own first one is), and a stream and its buffered replay (the response cache)
name a call the same."""

from __future__ import annotations

from providers.base import CallContext


def made_call_id(ctx: CallContext, choice: int, k: int) -> str:
    """The id of call `k` of the call's choice `choice` (its own index) in the answer `ctx` makes."""
    return f"call_{ctx.id.rpartition('-')[2]}_{ctx.first_choice + choice}_{k}"


__all__ = ["made_call_id"]
