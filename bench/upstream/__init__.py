"""Fixed payloads shared by the loopback upstreams (nginx and the Python server).

Both upstreams must answer byte-for-byte the same body, otherwise "direct" and "through the
gateway" would not be comparing like with like.
"""

from __future__ import annotations

import msgspec

COMPLETION: dict[str, object] = {
    "id": "cmpl-bench",
    "object": "text_completion",
    "created": 1700000000,
    "model": "bench-model",
    "choices": [{"text": " hello world", "index": 0, "logprobs": None, "finish_reason": "length"}],
    "usage": {"prompt_tokens": 5, "completion_tokens": 16, "total_tokens": 21},
}

COMPLETION_BODY: bytes = msgspec.json.encode(COMPLETION)

# What both upstreams answer on /v1/chat/completions: the same text and usage in the chat shape.
CHAT_COMPLETION: dict[str, object] = {
    "id": "chatcmpl-bench",
    "object": "chat.completion",
    "created": 1700000000,
    "model": "bench-model",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": " hello world"}, "finish_reason": "length"}],
    "usage": {"prompt_tokens": 5, "completion_tokens": 16, "total_tokens": 21},
}

CHAT_BODY: bytes = msgspec.json.encode(CHAT_COMPLETION)


def stream_events(chunks: int) -> list[bytes]:
    """Return the SSE events of one streamed completion, ``[DONE]`` sentinel included.

    Every chunk is a complete ``text_completion`` object, as OpenAI sends them, so a gateway
    that re-parses each event pays the realistic per-event cost.
    """
    events: list[bytes] = []
    for index in range(chunks):
        last = index == chunks - 1
        chunk = {
            "id": "cmpl-bench",
            "object": "text_completion",
            "created": 1700000000,
            "model": "bench-model",
            "choices": [
                {
                    "text": f" tok{index}",
                    "index": 0,
                    "logprobs": None,
                    "finish_reason": "length" if last else None,
                }
            ],
        }
        events.append(b"data: " + msgspec.json.encode(chunk) + b"\n\n")
    events.append(b"data: [DONE]\n\n")
    return events


def chat_stream_events(chunks: int) -> list[bytes]:
    """The SSE events of one streamed chat completion: ``chat.completion.chunk`` deltas, then ``[DONE]``."""
    events: list[bytes] = []
    for index in range(chunks):
        last = index == chunks - 1
        delta: dict[str, str] = {"role": "assistant", "content": ""} if index == 0 else {"content": f" tok{index}"}
        chunk = {
            "id": "chatcmpl-bench",
            "object": "chat.completion.chunk",
            "created": 1700000000,
            "model": "bench-model",
            "choices": [{"index": 0, "delta": delta, "finish_reason": "length" if last else None}],
        }
        events.append(b"data: " + msgspec.json.encode(chunk) + b"\n\n")
    events.append(b"data: [DONE]\n\n")
    return events
