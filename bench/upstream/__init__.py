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
