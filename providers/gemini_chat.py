"""OpenAI's chat conversation as Gemini's `generateContent` request, and Gemini's candidates back as
`chat.completion` (providers/gemini.py sends and reads them).

Requests: `system` and `developer` messages become `systemInstruction`; user and assistant turns become
`contents` with roles `user` and `model` (turns of one role merged); an assistant's `tool_calls` become
`functionCall` parts (arguments must be a JSON object) and `tool` messages `functionResponse` parts, named
by the call they answer; tools are `functionDeclarations` with `parametersJsonSchema`, `tool_choice` is
`toolConfig.functionCallingConfig`. Answers: text parts join into the content, thought summaries into
`reasoning_content`, `functionCall` parts become `tool_calls`, each whole (a stream gives a call one delta).
A call's id is Gemini's own or one made from the answer's; its `thoughtSignature` (which Gemini 3 wants
back on the next turn) travels at the end of the id, after `SIGNATURE`, and is sent back from there.
"""

from __future__ import annotations

from typing import Any, Final, Literal

import msgspec

from providers.base import CallContext
from providers.call_ids import made_call_id
from providers.chat_parts import answer_message, assistant_text, call_arguments
from providers.finish import finish_reason
from providers.offsets import aligned
from wire.chat import (
    ChatChoice,
    ChatChunk,
    ChatCompletion,
    ChatFinishReason,
    ChatLogprobs,
    ChatMessage,
    ChunkChoice,
    Delta,
    FunctionDelta,
    TokenLogprob,
    ToolCallDelta,
    TopLogprob,
)
from wire.errors import InvalidRequestError, UnsupportedParamError, shown
from wire.messages import (
    AssistantMessage,
    DeveloperMessage,
    FunctionCall,
    Message,
    SystemMessage,
    TextPart,
    ToolCall,
    ToolMessage,
    UserMessage,
)
from wire.schema import Usage

# Between a tool call's id and the thought signature it carries (no base64 alphabet has `~`).
SIGNATURE: Final = "~sig~"


# --------------------------------------------------------------------------------------------------
# Request


def tools(body: dict[str, Any], value: list[dict[str, Any]]) -> None:
    declarations = []
    for t in value:
        fn = t["function"]
        decl: dict[str, Any] = {"name": fn["name"]}
        if fn.get("description"):
            decl["description"] = fn["description"]
        if fn.get("parameters") is not None:
            # JSON Schema as clients write it (`additionalProperties`, `$defs`...), which `parameters`
            # (Gemini's OpenAPI subset) refuses.
            decl["parametersJsonSchema"] = fn["parameters"]
        declarations.append(decl)
    body["tools"] = [{"functionDeclarations": declarations}]


def tool_choice(body: dict[str, Any], choice: str | dict[str, Any]) -> None:
    if isinstance(choice, dict):
        config: dict[str, Any] = {"mode": "ANY", "allowedFunctionNames": [choice["function"]["name"]]}
    else:
        config = {"mode": {"auto": "AUTO", "required": "ANY", "none": "NONE"}[choice]}
    body["toolConfig"] = {"functionCallingConfig": config}


def _texts(content: str | list[TextPart]) -> str:
    return content if isinstance(content, str) else "".join(p.text for p in content)


def _image(url: str, provider: str) -> dict[str, Any]:
    if url.startswith("data:") and ";base64," in url:
        mime, _, data = url[len("data:") :].partition(";base64,")
        return {"inlineData": {"mimeType": mime, "data": data}}
    raise UnsupportedParamError(
        "messages", provider, f"Provider '{provider}' (Gemini) takes images in chat as base64 data: URLs only"
    )


def _user(m: UserMessage, provider: str) -> list[dict[str, Any]]:
    if isinstance(m.content, str):
        return [{"text": m.content}]
    return [{"text": p.text} if isinstance(p, TextPart) else _image(p.image_url.url, provider) for p in m.content]


def _assistant(m: AssistantMessage, names: dict[str, str]) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = []
    text = assistant_text(m)
    if text:
        parts.append({"text": text})
    for call in m.tool_calls or ():
        args = call_arguments(call, "Gemini")
        names[call.id] = call.function.name
        call_id, _, signature = call.id.partition(SIGNATURE)
        function: dict[str, Any] = {"name": call.function.name, "args": args}
        if call_id:
            function["id"] = call_id
        part: dict[str, Any] = {"functionCall": function}
        if signature:
            part["thoughtSignature"] = signature
        parts.append(part)
    return parts


def _tool(m: ToolMessage, names: dict[str, str]) -> list[dict[str, Any]]:
    name = names.get(m.tool_call_id)
    if name is None:
        # Gemini names a function's result by the function: it must answer a call made earlier.
        raise InvalidRequestError(
            f"Tool message answers '{shown(m.tool_call_id)}', which no earlier assistant message calls; Gemini names "
            "each tool result by its call's function",
            param="messages",
            code="invalid_value",
        )
    response: dict[str, Any] = {"name": name, "response": {"content": _texts(m.content)}}
    call_id = m.tool_call_id.partition(SIGNATURE)[0]
    if call_id:
        response["id"] = call_id
    return [{"functionResponse": response}]


def to_contents(messages: list[Message], provider: str) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """The `systemInstruction` (None without one) and the `contents` of Gemini's request."""
    system: list[dict[str, Any]] = []
    turns: list[dict[str, Any]] = []
    names: dict[str, str] = {}  # tool call id -> function name, for the results that answer them
    for m in messages:
        if isinstance(m, SystemMessage | DeveloperMessage):
            system.append({"text": _texts(m.content)})
            continue
        if isinstance(m, UserMessage):
            role, parts = "user", _user(m, provider)
        elif isinstance(m, AssistantMessage):
            role, parts = "model", _assistant(m, names)
        else:
            assert isinstance(m, ToolMessage)
            role, parts = "user", _tool(m, names)
        if not parts:
            continue  # an assistant message with neither text nor calls: Gemini refuses empty turns
        if turns and turns[-1]["role"] == role:
            turns[-1]["parts"].extend(parts)
        else:
            turns.append({"role": role, "parts": parts})
    return ({"parts": system} if system else None), turns


# --------------------------------------------------------------------------------------------------
# Answer


def _logprobs(lr: Any) -> ChatLogprobs | None:
    """Gemini's `logprobsResult` (chosen candidates, and the top candidates at each step) as chat's."""
    if lr is None:
        return None
    tops = lr.top_candidates
    if tops:
        aligned(lr.chosen_candidates, tops)  # a step each, as on completions
    content = []
    for i, chosen in enumerate(lr.chosen_candidates):
        alternatives = tops[i].candidates if i < len(tops) else []
        top = [TopLogprob(a.token, a.log_probability, list(a.token.encode())) for a in alternatives]
        content.append(TokenLogprob(chosen.token, chosen.log_probability, list(chosen.token.encode()), top))
    return ChatLogprobs(content=content)


def _call(ctx: CallContext, index: int, k: int, part: Any) -> tuple[str, str, str]:
    """A `functionCall` part's id (its own, else one made from the answer's; its thought signature
    after `SIGNATURE`), name and arguments (its `args` object as JSON)."""
    fc = part.function_call
    base = fc.id or made_call_id(ctx, index, k)
    call_id = base + SIGNATURE + part.thought_signature if part.thought_signature else base
    return call_id, fc.name, msgspec.json.encode(fc.args if fc.args is not None else {}).decode()


def _finish(word: str | None, calls: bool) -> ChatFinishReason | None:
    # Gemini ends a turn of function calls with STOP: OpenAI's clients look for `tool_calls`.
    folded = finish_reason(word)
    return "tool_calls" if folded == "stop" and calls else folded


def _index(c: Any, position: int) -> int:
    return c.index if c.index is not None else position


def _parts(c: Any) -> list[Any]:
    return c.content.parts if c.content is not None else []


def _text(parts: list[Any]) -> str:
    return "".join(p.text for p in parts if p.text is not None and not p.thought)


def _thoughts(parts: list[Any]) -> str:
    """The thought summaries (`includeThoughts`): the reasoning, apart from the answer."""
    return "".join(p.text for p in parts if p.text is not None and p.thought)


def chat_answer(candidates: list[Any], usage: Usage | None, ctx: CallContext) -> ChatCompletion:
    """A `generateContent` answer's candidates as `chat.completion`; none (a blocked prompt) is every
    choice filtered."""
    choices = []
    for position, c in enumerate(candidates):
        index = _index(c, position)
        calls = []
        for k, part in enumerate(p for p in _parts(c) if p.function_call is not None):
            call_id, name, arguments = _call(ctx, index, k, part)
            calls.append(ToolCall(id=call_id, function=FunctionCall(name=name, arguments=arguments)))
        text = _text(_parts(c))
        message = answer_message(text, calls, _thoughts(_parts(c)))
        choices.append(ChatChoice(index, message, _finish(c.finish_reason, bool(calls)), _logprobs(c.logprobs_result)))
    if not candidates:
        choices = [
            ChatChoice(i, ChatMessage(role="assistant", content=""), "content_filter", None) for i in range(ctx.n)
        ]
    return ChatCompletion(ctx.id, ctx.created, ctx.model, choices, usage=usage)


def chat_chunk(candidates: list[Any], usage: Usage | None, ctx: CallContext) -> ChatChunk | None:
    """One `streamGenerateContent` event as one chunk: per candidate, the role on its first delta, its
    text, each whole `functionCall` as one tool-call delta (id, name and all its arguments), its finish;
    `usage` (the event's running count) only on the chunk that finishes; thought summaries as
    `reasoning_content`. None for an event that adds nothing."""
    started: set[int] = ctx.state.setdefault("started", set())
    seen: dict[int, int] = ctx.state.setdefault("calls", {})
    choices = []
    final = False
    for position, c in enumerate(candidates):
        index = _index(c, position)
        deltas = []
        for part in _parts(c):
            if part.function_call is None:
                continue
            k = seen.get(index, 0)
            seen[index] = k + 1
            call_id, name, arguments = _call(ctx, index, k, part)
            function = FunctionDelta(name=name, arguments=arguments)
            deltas.append(ToolCallDelta(index=k, id=call_id, type="function", function=function))
        text = _text(_parts(c))
        thoughts = _thoughts(_parts(c))
        role: Literal["assistant"] | None = None if index in started else "assistant"
        started.add(index)
        finish = _finish(c.finish_reason, seen.get(index, 0) > 0)
        final = final or finish is not None
        logprobs = _logprobs(c.logprobs_result)
        if role is None and not text and not thoughts and not deltas and finish is None and logprobs is None:
            continue
        content = text or (None if deltas or finish or thoughts else "")
        delta = Delta(role=role, content=content, tool_calls=deltas or None, reasoning_content=thoughts or None)
        choices.append(ChunkChoice(index, delta, finish, logprobs))
    if not candidates:  # a blocked prompt
        choices = [ChunkChoice(i, Delta(role="assistant", content=""), "content_filter", None) for i in range(ctx.n)]
        final = True
    if not choices:
        return None
    return ChatChunk(ctx.id, ctx.created, ctx.model, choices, usage=usage if final else None)


__all__ = ["SIGNATURE", "chat_answer", "chat_chunk", "to_contents", "tool_choice", "tools"]
