"""What one upstream call's parsers know of the request: the client-facing id, time and model, what the
request asked for that shapes the answer, and the call's own stream state.

One `CallContext` per upstream call (gateway/path/attempt.py `_fresh`), never shared between calls.
"""

from __future__ import annotations

from typing import Any

import msgspec

from wire.schema import Choice, Completion, FinishReason, Logprobs, Usage


class CallContext(msgspec.Struct):
    """Per-call facts the parsers need to produce the client-facing shape."""

    id: str
    created: int
    model: str  # the model string the client sent, echoed back as-is
    prompts: list[str] | None = None  # text prompts, to compute text offsets
    n: int = 1
    echo: bool = False
    logprobs: bool = False  # the request asked for logprobs
    top_logprobs: int = 0  # the alternatives it asked for per token (the count `logprobs` folds in)
    # Stream state: running text offset per choice index, for providers that do not send offsets.
    offsets: dict[int, int] = msgspec.field(default_factory=dict)
    # Adapter-private stream state (e.g. Anthropic's input tokens from `message_start`, needed when
    # `message_delta` brings the output tokens). One CallContext per upstream call, never shared.
    state: dict[str, Any] = msgspec.field(default_factory=dict)
    stop_reason: bool = False  # the request's `include_stop_reason`: relay which stop ended each choice
    chat: bool = False  # a chat request: its chunks are `chat.completion.chunk`s
    # The answer's index of this call's first choice: a fan-out's j-th call answers choice j (its own choice 0).
    # The ids the gateway makes for tool calls the provider left without one carry it (providers/call_ids.py).
    first_choice: int = 0
    # The route's dialect puts a stream's usage on its last chunk unless the client asked for the usage chunk.
    usage_last: bool = False
    # Set by a stream-event parser on the upstream's last event of the answer (Ollama's `done`, Anthropic's
    # `message_stop`): the stream ends with that event's chunk, if any, whether or not the body does
    # (gateway/path/events.py). `data: [DONE]` ends every kind's stream without it.
    ended: bool = False
    # Counted by a stream-event parser for model output the route leaves out (a thinking delta on
    # /v1/completions): the model is working, so the idle caps (gateway/path/events.py) do not end its stream.
    working: int = 0

    def completion(
        self, choices: list[Choice], usage: Usage | None = None, system_fingerprint: str | None = None
    ) -> Completion:
        """This call's client-facing Completion (or stream chunk): its id, time and the client's model."""
        return Completion(
            id=self.id,
            created=self.created,
            model=self.model,
            choices=choices,
            usage=usage,
            system_fingerprint=system_fingerprint,
        )

    def single(
        self, text: str, finish: FinishReason | None, logprobs: Logprobs | None = None, usage: Usage | None = None
    ) -> Completion:
        """A one-choice answer or chunk; index 0, since the gateway re-indexes what it fans out."""
        return self.completion([Choice(text=text, index=0, logprobs=logprobs, finish_reason=finish)], usage)


__all__ = ["CallContext"]
