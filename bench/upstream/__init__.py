"""Fixed payloads shared by the loopback upstreams (nginx and the Python server).

Both upstreams must answer byte-for-byte the same body, otherwise "direct" and "through the
gateway" would not be comparing like with like.

The chat answers (the Python server's, on a path ending in ``/chat/completions``) are the completion's
twins, so a chat request and a completion are measured on answers of the same size: the same text and
usage in OpenAI's recorded ``chat.completion`` shape (tests/fixtures/openai/chat_completion.json), and a
stream of as many events, shaped as OpenAI streams chat (the role first, content deltas, an empty delta
with the finish reason; tests/fixtures/openai/chat_stream_tool_calls_parallel.sse.txt).
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

CHAT: dict[str, object] = {
    "id": "chatcmpl-bench",
    "object": "chat.completion",
    "created": 1700000000,
    "model": "bench-model",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": " hello world"},
            "logprobs": None,
            "finish_reason": "length",
        }
    ],
    "usage": {"prompt_tokens": 5, "completion_tokens": 16, "total_tokens": 21},
    "system_fingerprint": "fp_bench",
}

CHAT_BODY: bytes = msgspec.json.encode(CHAT)


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
    """Return the SSE events of one streamed chat answer, as many as `stream_events` gives, ``[DONE]`` included:
    the role (with empty content) first, content deltas, then an empty delta carrying the finish reason."""
    events: list[bytes] = []
    for index in range(chunks):
        last = index == chunks - 1
        delta: dict[str, object] = {}
        if index == 0:
            delta = {"role": "assistant", "content": ""}
        elif not last:
            delta = {"content": f" tok{index}"}
        chunk = {
            "id": "chatcmpl-bench",
            "object": "chat.completion.chunk",
            "created": 1700000000,
            "model": "bench-model",
            "system_fingerprint": "fp_bench",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": "length" if last else None}],
        }
        events.append(b"data: " + msgspec.json.encode(chunk) + b"\n\n")
    events.append(b"data: [DONE]\n\n")
    return events
