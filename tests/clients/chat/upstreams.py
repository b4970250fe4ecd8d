"""The chat tests' config, key, tools and loopback upstream.

The upstream speaks OpenAI's chat wire from recordings (tests/fixtures/SOURCES.md): a plain answer, a tool
call, a stream of two parallel tool calls (arguments in pieces), and Azure's text stream (its prompt-filter
chunk first); on `/v1/messages`, Anthropic's recorded tool use, plain and streamed.
"""

from __future__ import annotations

import json
from typing import Any, Final

from aiohttp import web

from tests.helpers.recordings import FIXTURES
from tests.helpers.upstreams import Received

KEY = "gk-chat-3f1a"
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "get_current_weather",
            "description": "Get the current weather",
            "parameters": {
                "type": "object",
                "properties": {"location": {"type": "string", "description": "The city and state"}},
                "required": ["location"],
            },
        },
    }
]
MESSAGES: list[Any] = [{"role": "user", "content": "What's the weather like in San Francisco?"}]
CALL: Final = {"name": "get_current_weather", "arguments": '{"location": "Boston, MA"}'}

CONFIG = """
server: {{host: 127.0.0.1, port: 0}}
unsupported_params: error
timeouts: {{connect_ms: 2000, first_byte_ms: 10000, total_ms: 20000}}
retries: {{attempts: 1}}
ledger: {{url: "sqlite:///{db}", flush_ms: 50}}
keys:
  - {{name: chat, key: "${{CHAT_KEY}}"}}
providers:
  oa: {{kind: openai, base_url: {u}/v1, api_key: sk-upstream}}
  hosted: {{kind: vllm, base_url: {u}/v1}}
  demo: {{kind: fake}}
  claude: {{kind: anthropic, base_url: {u}, api_key: sk-ant}}
  legacy: {{kind: nochat, base_url: {u}/v1}}
  down: {{kind: vllm, base_url: "http://127.0.0.1:1/v1"}}
models:
  - name: resilient
    targets: [{{model: down/served}}]
    fallbacks: [oa/gpt-3.5-turbo]
    retries: {{attempts: 2}}
  - name: cached
    targets: [{{model: hosted/served}}]
    cache: {{mode: always}}
"""


def sse(name: str) -> list[bytes]:
    """A recorded stream's `data:` events, as recorded."""
    text = (FIXTURES / name).read_bytes()
    return [e.strip() for e in text.split(b"\n\n") if e.strip()]


def data(events: list[bytes]) -> list[dict[str, Any]]:
    return [json.loads(e[len(b"data: ") :]) for e in events if e != b"data: [DONE]"]


async def handler(request: web.Request, received: Received) -> web.StreamResponse:
    if received.path == "/v1/messages":
        return await _anthropic(request, received)
    if not received.path.endswith("/chat/completions"):
        return web.json_response({"error": {"message": "not found"}}, status=404)
    body = received.json()
    if not body.get("stream"):
        name = "openai/chat_tool_calls.json" if body.get("tools") else "openai/chat_completion.json"
        answer = (FIXTURES / name).read_bytes()
        return web.Response(body=_without_ids(answer, body["model"]), content_type="application/json")
    name = "openai/chat_stream_tool_calls_parallel.sse.txt" if body.get("tools") else "azure/chat_stream_usage.sse.txt"
    resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await resp.prepare(request)
    for event in sse(name):
        if event != b"data: [DONE]":
            event = b"data: " + _without_ids(event[len(b"data: ") :], body["model"])
        await resp.write(event + b"\n\n")
    await resp.write_eof()
    return resp


def _without_ids(body: bytes, model: str) -> bytes:
    """A recorded answer or chunk as it came; for the model `noids`, with its tool calls' ids taken out (left out
    of a message's calls, empty in a stream's first piece of each), as an OpenAI-compatible server that sends
    none would answer."""
    if model != "noids":
        return body
    answer = json.loads(body)
    for choice in answer["choices"]:
        for call in (choice.get("message") or choice.get("delta") or {}).get("tool_calls") or ():
            if "message" in choice:
                del call["id"]
            elif "id" in call:
                call["id"] = "" if call["index"] % 2 else None  # an id of "" or null: neither names the call
    return json.dumps(answer).encode()


async def _anthropic(request: web.Request, received: Received) -> web.StreamResponse:
    if not received.json().get("stream"):
        body = (FIXTURES / "anthropic/messages_tool_use.json").read_bytes()
        return web.Response(body=body, content_type="application/json")
    resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await resp.prepare(request)
    for event in sse("anthropic/messages_stream_tool_use.sse.txt"):
        await resp.write(event + b"\n\n")
    await resp.write_eof()
    return resp
