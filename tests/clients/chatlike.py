"""A loopback server answering OpenAI's `POST /v1/chat/completions`, computed from the request, for the
client tests (the SDKs, LangChain, lm-eval) that need answers which depend on what they asked.

The wire shape is OpenAI's, from the recordings (tests/fixtures/SOURCES.md): the envelope and a choice's
keys of `openai/chat_completion.json`, a tool call as in `openai/chat_tool_calls.json` (compact JSON
arguments, `content: null`, `finish_reason: "tool_calls"`), and the stream of
`openai/chat_stream_tool_calls_parallel.sse.txt` and `azure/chat_stream_usage.sse.txt`: a role chunk first
(`content: null` before tool calls, `""` before text), content deltas, a tool call's `id`, `type` and
`function.name` with empty `arguments` then the arguments in pieces, a finish chunk with an empty delta,
then (with `stream_options.include_usage`, when every chunk carries `"usage": null`) a chunk with empty
`choices` and the usage, and `data: [DONE]`.

What it answers:
- the last message a `tool` result: a text quoting it (the end of an agent loop);
- `tools` (and `tool_choice` not `none`): a call of the named function, or the first, whose arguments are
  an instance of the function's `parameters` schema (`instance`);
- `response_format` `json_schema`: an instance of the schema as the content; `json_object`: an object;
- otherwise words drawn from a hash of the conversation, cut by `max_tokens` (`finish_reason: "length"`)
  or before the first `stop` sequence;
- `n` choices, and with `logprobs` each content token's logprob and `top_logprobs` alternatives.
"""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

from aiohttp import web

from tests.helpers.recordings import fixture_json
from tests.helpers.upstreams import Received

WORDS = (" The", " answer", " is", " four", ".", " Two", " plus", " two", " makes", " four", "\n", " Done")
ARGUMENT_PIECE = 5  # characters per streamed arguments delta (OpenAI's are a token or two)


def digest(*parts: object) -> int:
    return int.from_bytes(hashlib.blake2b("\x00".join(map(str, parts)).encode(), digest_size=8).digest(), "big")


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content if isinstance(p, dict))


def instance(schema: dict[str, Any], defs: dict[str, Any] | None = None, name: str = "value") -> Any:
    """A value valid for the JSON schema (the subset OpenAI's strict mode and Pydantic produce)."""
    defs = schema.get("$defs", defs or {})
    if "$ref" in schema:
        return instance(defs[schema["$ref"].rsplit("/", 1)[-1]], defs, name)
    if "enum" in schema:
        return schema["enum"][0]
    if "const" in schema:
        return schema["const"]
    for key in ("anyOf", "oneOf", "allOf"):
        if key in schema:
            options = [s for s in schema[key] if s.get("type") != "null"] or schema[key]
            return instance(options[0], defs, name)
    kind = schema.get("type", "object")
    if isinstance(kind, list):
        kind = next(k for k in kind if k != "null")
    if kind == "object":
        props: dict[str, Any] = schema.get("properties") or {}
        return {k: instance(v, defs, k) for k, v in props.items()}
    if kind == "array":
        return [instance(schema.get("items") or {"type": "string"}, defs, name)]
    if kind == "integer":
        return len(name)
    if kind == "number":
        return len(name) + 0.5
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    return f"{name}-{digest(name) % 1000}"


class ChatLike:
    """The answers (module docstring); `handler` serves them on a `tests.helpers.upstreams.Upstream`."""

    def __init__(self) -> None:
        self.template = fixture_json("openai/chat_completion.json")

    @staticmethod
    def _limit(body: dict[str, Any]) -> int:
        limit = body.get("max_completion_tokens", body.get("max_tokens"))
        return 1 << 20 if limit is None else int(limit)  # chat routes default to what the context leaves

    def choice(self, body: dict[str, Any], j: int) -> dict[str, Any]:
        """One choice: `content`, `tokens` (the content's pieces), `tool_calls`, `finish_reason`."""
        messages = body["messages"]
        conversation = json.dumps(messages, sort_keys=True)
        last = messages[-1]
        tools = body.get("tools") or []
        chosen = body.get("tool_choice", "auto")
        fmt = body.get("response_format") or {}
        if last["role"] != "tool" and tools and chosen != "none":
            function = next(
                (
                    t["function"]
                    for t in tools
                    if not isinstance(chosen, dict) or t["function"]["name"] == chosen["function"]["name"]
                ),
            )
            arguments = json.dumps(instance(function.get("parameters") or {}), separators=(",", ":"))
            call = {
                "id": f"call_{digest(conversation, j):016x}",
                "type": "function",
                "function": {"name": function["name"], "arguments": arguments},
            }
            return {"content": None, "tokens": [], "tool_calls": [call], "finish_reason": "tool_calls"}
        if last["role"] == "tool":
            tokens = [" The", " tool", " said", ":", f" {_text(last['content'])}"]
        elif fmt.get("type") == "json_schema":
            value = instance(fmt["json_schema"].get("schema") or {})
            text = json.dumps(value)
            tokens = [text[i : i + 4] for i in range(0, len(text), 4)]
        elif fmt.get("type") == "json_object":
            tokens = ['{"', "answer", '":', ' "', "four", '"}']
        else:
            seed = digest(conversation, j, body.get("seed"))
            tokens = [WORDS[(seed + i) % len(WORDS)] for i in range(6 + seed % 6)]
        finish = "stop"
        if len(tokens) > self._limit(body):
            tokens, finish = tokens[: self._limit(body)], "length"
        stop = body.get("stop") or []
        full = "".join(tokens)
        hits = [full.find(s) for s in ([stop] if isinstance(stop, str) else stop) if s and s in full]
        if hits:
            cut, finish, kept, pos = min(hits), "stop", [], 0
            for tok in tokens:
                if pos >= cut:
                    break
                kept.append(tok[: cut - pos])
                pos += len(tok)
            tokens = kept
        return {"content": "".join(tokens), "tokens": tokens, "tool_calls": None, "finish_reason": finish}

    @staticmethod
    def logprobs(tokens: list[str], k: int, start: int = 0) -> list[dict[str, Any]]:
        out = []
        for i, tok in enumerate(tokens, start):
            lp = -round((digest(tok, i) % 50) / 100 + 0.01, 4)
            top = [{"token": tok, "logprob": lp, "bytes": list(tok.encode())}]
            top += [
                {"token": f"<alt{a}>", "logprob": round(lp - 0.5 * (a + 1), 4), "bytes": list(f"<alt{a}>".encode())}
                for a in range(max(k - 1, 0))
            ]
            out.append({"token": tok, "logprob": lp, "bytes": list(tok.encode()), "top_logprobs": top[:k]})
        return out

    def choices(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        return [self.choice(body, j) for j in range(body.get("n") or 1)]

    @staticmethod
    def usage(body: dict[str, Any], choices: list[dict[str, Any]]) -> dict[str, int]:
        prompt = sum(len(_text(m.get("content")).split()) + 3 for m in body["messages"])
        completion = sum(len(c["tokens"]) + (8 if c["tool_calls"] else 0) for c in choices)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def _head(self, body: dict[str, Any]) -> dict[str, Any]:
        return {
            "id": f"chatcmpl-{digest(json.dumps(body, sort_keys=True)):016x}",
            "created": self.template["created"],
            "model": body["model"],
        }

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        choices = self.choices(body)
        out: dict[str, Any] = copy.deepcopy(self.template) | self._head(body)
        out["choices"] = []
        for j, c in enumerate(choices):
            message: dict[str, Any] = {"role": "assistant", "content": c["content"]}
            if c["tool_calls"]:
                message["tool_calls"] = c["tool_calls"]
            k = body.get("top_logprobs") or 0
            lps = {"content": self.logprobs(c["tokens"], k)} if body.get("logprobs") else None
            choice = {"index": j, "message": message, "logprobs": lps, "finish_reason": c["finish_reason"]}
            out["choices"].append(choice)
        out["usage"] = self.usage(body, choices)
        return out

    def chunks(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        choices = self.choices(body)
        with_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        head = self._head(body) | {"object": "chat.completion.chunk", "system_fingerprint": None}

        def chunk(j: int, delta: dict[str, Any], finish: str | None = None, lps: Any = None) -> dict[str, Any]:
            out = head | {"choices": [{"index": j, "delta": delta, "logprobs": lps, "finish_reason": finish}]}
            return out | ({"usage": None} if with_usage else {})

        out = []
        for j, c in enumerate(choices):
            out.append(chunk(j, {"role": "assistant", "content": None if c["tool_calls"] else ""}))
            for i, call in enumerate(c["tool_calls"] or ()):
                fn = call["function"]
                out.append(chunk(j, {"tool_calls": [{"index": i, **call, "function": {**fn, "arguments": ""}}]}))
                args = fn["arguments"]
                for at in range(0, len(args), ARGUMENT_PIECE):
                    piece = {"index": i, "function": {"arguments": args[at : at + ARGUMENT_PIECE]}}
                    out.append(chunk(j, {"tool_calls": [piece]}))
            k = body.get("top_logprobs") or 0
            for i, tok in enumerate(c["tokens"]):
                lps = {"content": self.logprobs([tok], k, i)} if body.get("logprobs") else None
                out.append(chunk(j, {"content": tok}, lps=lps))
            out.append(chunk(j, {}, c["finish_reason"]))
        if with_usage:
            out.append(head | {"choices": [], "usage": self.usage(body, choices)})
        return out

    async def handler(self, request: web.Request, received: Received) -> web.StreamResponse:
        if received.path != "/v1/chat/completions":
            return web.json_response({"error": {"message": "not found", "type": "invalid_request_error"}}, status=404)
        body = received.json()
        if not body.get("stream"):
            return web.json_response(self.answer(body))
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        for c in self.chunks(body):
            await resp.write(b"data: " + json.dumps(c).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


__all__ = ["ChatLike", "instance"]
