"""The reasoning tests' config, key, conversations and loopback upstream.

The upstream replays recordings (tests/fixtures/SOURCES.md) by path: Anthropic's thinking blocks, Gemini's
thought summaries, Magistral's thinking chunks, DeepSeek's thinking turn with a tool call (also for any
OpenAI-wire model named `tool-thinker`), and OpenAI's plain answer for the rest; plain and streamed.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from tests.helpers.recordings import fixture_bytes
from tests.helpers.upstreams import Received

KEY = "gk-reason-51c2"
MESSAGES: list[Any] = [{"role": "user", "content": "How do I cross the street?"}]
CONFIG = """
server: {{host: 127.0.0.1, port: 0}}
unsupported_params: error
timeouts: {{connect_ms: 2000, first_byte_ms: 10000, total_ms: 20000}}
retries: {{attempts: 1}}
keys:
  - {{name: reasoner, key: "${{REASON_KEY}}"}}
providers:
  oa: {{kind: openai, base_url: {u}/v1, api_key: sk-upstream}}
  hosted: {{kind: vllm, base_url: {u}/v1}}
  claude: {{kind: anthropic, base_url: {u}, api_key: sk-ant}}
  gem: {{kind: gemini, base_url: {u}/gemini, api_key: k}}
  mis: {{kind: mistral, base_url: {u}/mistral, api_key: k}}
  ds: {{kind: deepseek, base_url: {u}/ds, api_key: sk-ds}}
  local: {{kind: ollama, base_url: {u}}}
  fw: {{kind: fireworks, base_url: {u}/fw/v1, api_key: fw-k}}
models:
  - name: cached
    targets: [{{model: hosted/served}}]
    cache: {{mode: always}}
  - name: cached-claude
    targets: [{{model: claude/claude-sonnet-4-5}}]
    cache: {{mode: always}}
"""
# The model an OpenAI-wire upstream answers as DeepSeek's recorded thinking turn with a tool call.
TOOL_THINKER = "tool-thinker"
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "load_capability",
            "parameters": {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]},
        },
    }
]
QUESTION: list[Any] = [{"role": "user", "content": "My guess is 4"}]
THINKING = {"thinking": {"type": "enabled", "budget_tokens": 1024}}


def _events(raw: bytes) -> list[bytes]:
    return [e.strip() for e in raw.replace(b"\r\n", b"\n").split(b"\n\n") if e.strip()]


async def _stream(request: web.Request, events: list[bytes]) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await resp.prepare(request)
    for event in events:
        await resp.write(event + b"\n\n")
    await resp.write_eof()
    return resp


async def handler(request: web.Request, received: Received) -> web.StreamResponse:
    if received.path == "/v1/messages":
        if received.json().get("stream"):
            return await _stream(request, _events(fixture_bytes("anthropic/messages_stream_thinking.sse.txt")))
        return web.Response(body=fixture_bytes("anthropic/messages_thinking.json"), content_type="application/json")
    if received.path.startswith("/gemini/"):
        if received.path.endswith(":streamGenerateContent"):
            return await _stream(request, _events(fixture_bytes("gemini/stream_generate_content_thoughts.sse.txt")))
        body = fixture_bytes("gemini/generate_content_thoughts.json")
        return web.Response(body=body, content_type="application/json")
    if received.path.startswith("/mistral/"):
        if received.json().get("stream"):
            return await _stream(request, _events(fixture_bytes("mistral/chat_stream_magistral_thinking.sse.txt")))
        body = fixture_bytes("mistral/chat_magistral_thinking.json")
        return web.Response(body=body, content_type="application/json")
    if received.path.startswith("/ds/") or received.json().get("model") == TOOL_THINKER:
        body = fixture_bytes("deepseek/chat_thinking_tool_calls.json")
        return web.Response(body=body, content_type="application/json")
    return web.Response(body=fixture_bytes("openai/chat_completion.json"), content_type="application/json")
