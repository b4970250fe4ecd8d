"""AWS Bedrock tests' shared setup: the adapter as the router builds it, credentials and the field lists, and
for chat on Converse the endpoint, the recorded conversation's tool, and the request and stream helpers."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import msgspec

from gateway.path.chat_request import normalize_chat
from gateway.upstream.framing import DECODERS, EventStreamDecoder
from providers.base import CallContext, Endpoint, map_params
from providers.bedrock import DEFAULT_BASE_URL, BedrockAdapter
from tests.helpers.adapters import chunked
from tests.helpers.eventstream import split_frames
from wire.chat import ChatChunk, ChatRequest, decode_chat

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
ADAPTER = BedrockAdapter(clock=lambda: NOW)


STREAM = "bedrock/converse_stream.eventstream"


def decode_frames(raw: bytes, size: int) -> list[tuple[str | None, bytes]]:
    decoder = EventStreamDecoder()
    return [e for part in chunked(raw, size) for e in decoder.feed(part)] + decoder.close()


NOVA = "us.amazon.nova-micro-v1:0"
CLAUDE = "anthropic.claude-3-haiku-20240307-v1:0"
ENDPOINT = Endpoint(
    provider="aws",
    model=NOVA,
    base_url=DEFAULT_BASE_URL,
    api_key="AKIDEXAMPLE:wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
    region="us-east-1",
)
# The tool of the recorded ConverseStream (pydantic-ai's test_bedrock_model_iter_stream), as OpenAI's tool.
CITY = {
    "properties": {"city": {"description": "The city name.", "title": "City", "type": "string"}},
    "required": ["city"],
    "type": "object",
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_temperature", "description": "Get the temperature in a city.", "parameters": CITY},
    }
]
USER = [{"role": "user", "content": "What is the temperature of the capital of France?"}]


def chat_ctx() -> CallContext:
    return CallContext(id="chatcmpl-b", created=1, model="aws/x", chat=True)


def chat_request(**body: Any) -> ChatRequest:
    req = decode_chat(msgspec.json.encode({"model": "aws/x", **body}))
    normalize_chat(req)
    return req


def sent_chat(req: ChatRequest, endpoint: Endpoint = ENDPOINT) -> tuple[str, dict[str, str], dict[str, Any]]:
    assert ADAPTER.chat_params is not None
    params, _ = map_params(req, ADAPTER.chat_params, endpoint.provider, False)
    up = ADAPTER.build_chat_request(req, endpoint, params)
    return up.url, up.headers, json.loads(up.body)


def chat_body(**body: Any) -> dict[str, Any]:
    return sent_chat(chat_request(**body))[2]


def chat_chunks(raw: bytes) -> list[ChatChunk]:
    decoder = DECODERS["eventstream"](max_event_bytes=1 << 20)
    ctx = chat_ctx()
    out = []
    for name, data in [*decoder.feed(raw), *decoder.close()]:
        chunk = ADAPTER.parse_chat_event(name, data, ctx)
        if chunk is not None:
            out.append(chunk)
    return out


def streamed_calls(chunks: list[ChatChunk]) -> dict[int, list[str]]:
    got: dict[int, list[str]] = {}
    for c in chunks:
        for choice in c.choices:
            for tc in choice.delta.tool_calls or ():
                slot = got.setdefault(tc.index, ["", "", ""])
                slot[0] += tc.id or ""
                slot[1] += (tc.function.name if tc.function else None) or ""
                slot[2] += (tc.function.arguments if tc.function else None) or ""
    return got


def frame_payloads(raw: bytes) -> list[dict[str, Any]]:
    # Each frame's JSON payload: after the 12-byte prelude and the headers, before the 4-byte CRC.
    out = []
    for f in split_frames(raw):
        headers_length = int.from_bytes(f[4:8], "big")
        out.append(json.loads(f[12 + headers_length : -4]))
    return out
