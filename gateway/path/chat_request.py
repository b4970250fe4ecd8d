"""A chat request's own checks and folds (`normalize_chat`), before `normalize`'s shared ones.

Its messages are walked once: bounded, their lm-eval marks cleared, an empty id or an empty assistant turn
refused, and the tool results that do not pair with their turn's calls, and calls the conversation ends on,
marked for the routes whose servers refuse them (providers/tool_results.py).
"""

from __future__ import annotations

import operator
from typing import Final

import msgspec

from gateway.config import CapsConfig
from gateway.path.dialects import decode_error
from gateway.path.echo import echoed
from gateway.path.request import invalid_value, normalize, refuse_held
from gateway.path.unrendered import NOTHING_BESIDE, chat_beside, image_parts, unrendered
from wire.chat import CHAT_SHAPES, ChatRequest
from wire.errors import InvalidRequestError
from wire.messages import AssistantMessage, ToolMessage, UserMessage, bound_conversation, render

_DEFAULT_CAPS: Final = CapsConfig()


def _empty_id(at: str, param: str) -> InvalidRequestError:
    # A tool message names the call it answers by its id, and an empty one names none: Gemini's adapter, which
    # pairs results with calls by id, would pair it with any other call left without one, and Anthropic and
    # Bedrock refuse it as a 400 of theirs. Refused here, in the client's terms, before any upstream sees it.
    return invalid_value(f"Invalid value for '{at}': Expected `str` of length >= 1", param)


_CHAT_SHAPES: Final = CHAT_SHAPES
_chat_shaped: Final = operator.attrgetter(*(name for name, _ in CHAT_SHAPES))
_NO_SHAPES: Final = (None,) * len(CHAT_SHAPES)


def _prefill(req: ChatRequest) -> None:
    """`continue_final_message` and `add_generation_prompt` as one choice: the trailing assistant message is
    continued (set), or the answer follows the conversation (None). Only a route that can continue takes
    the first; the second's own value (true) is every route's default, and false is vLLM's field alone."""
    if req.continue_final_message:
        if req.add_generation_prompt:
            raise invalid_value(
                "'continue_final_message' and 'add_generation_prompt' cannot both be true", "continue_final_message"
            )
        last = req.messages[-1]
        if not isinstance(last, AssistantMessage) or last.tool_calls or last.content is None:
            raise invalid_value(
                "'continue_final_message' continues the last message, which must be an assistant message with "
                "content and no tool calls",
                "messages",
            )
        req.add_generation_prompt = None  # implied
    else:
        req.continue_final_message = None
        if req.add_generation_prompt:
            req.add_generation_prompt = None


def _bound_echo(req: ChatRequest, limit: int) -> None:
    """Each choice repeats the echoed message: a message of megabytes times `n` is refused before any call."""
    total = len(echoed(req)) * (req.n or 1)
    if total > limit:
        raise invalid_value(
            f"'echo' would make the gateway build {total} bytes from copies of the last message (one per choice); "
            f"at most {limit} are allowed",
            "echo",
        )


# Completion-only fields chat's request holds under names with a leading space (wire.chat.ChatRequest), so that
# their real names are unknown fields there: sent under the held names, they are unknown fields all the same.
_COMPLETION_ONLY: Final = (
    "best_of",
    "echo",
    "suffix",
    "max_new_tokens",
    "stop_sequences",
    "return_token_log_probs",
    "images",
    "context_length_exceeded_behavior",
)
_completion_only: Final = operator.attrgetter(*_COMPLETION_ONLY)
_NONE_HELD: Final = (None,) * len(_COMPLETION_ONLY)


# The answers of no turn: a turn opens with a set of its own, so nothing is ever added to this one.
_UNOPENED: Final[set[str]] = set()


def normalize_chat(req: ChatRequest, caps: CapsConfig = _DEFAULT_CAPS) -> ChatRequest:
    """`normalize` for a chat request: `logprobs` is a boolean there, `tools`, `tool_choice` and
    `response_format` must have OpenAI's shapes, and `prompt` becomes the rendered conversation."""
    if _completion_only(req) != _NONE_HELD:
        refuse_held(req, _COMPLETION_ONLY)
    if req.logprobs is not None and not isinstance(req.logprobs, bool):
        raise invalid_value(
            "'logprobs' must be a boolean on chat completions; 'top_logprobs' sets the count", "logprobs"
        )
    if _chat_shaped(req) != _NO_SHAPES:  # one C call when none is set, as in most requests
        for name, shape in _CHAT_SHAPES:
            value = getattr(req, name)
            if value is not None:
                try:
                    msgspec.convert(value, shape)
                except msgspec.ValidationError as exc:
                    # Named from the body's root, as the decoder names any other field.
                    problem, at, path = str(exc).partition(" - at `$")
                    at = f"{problem} - at `$.{name}{path if at else '`'}"
                    raise decode_error(msgspec.ValidationError(at)) from None
    if req.prompt_logprobs is not None and req.stream:
        # No chat route streams them (vLLM's refuses): before the cache, whose buffered answer could carry them.
        raise invalid_value("'prompt_logprobs' are not available on a streamed chat completion", "prompt_logprobs")
    if req.tool_choice is not None and not req.tools:
        raise invalid_value("'tool_choice' is only allowed when 'tools' are given", "tool_choice")
    if req.parallel_tool_calls is not None and not req.tools:
        raise invalid_value("'parallel_tool_calls' is only allowed when 'tools' are given", "parallel_tool_calls")
    bound_conversation(req.messages, caps.chat_messages, caps.chat_content_parts, caps.json_depth)
    back = said = False
    images = 0
    calls: frozenset[str] = frozenset()  # the ids of the nearest assistant message before with tool calls
    unanswered = unreplied = repeated = None
    # The open turn: the index of the assistant message with tool calls until another assistant message follows
    # (-1: none), and the ids of its calls answered so far (made with the turn: none for a conversation without).
    turn = -1
    answered = _UNOPENED
    for i, m in enumerate(req.messages):
        if m.type is not None:
            m.type = None  # lm-eval's mark (wire.messages.Mark), for no upstream
        if m.__class__ is AssistantMessage:
            if turn >= 0:
                if unreplied is None and len(answered) < len(calls):
                    unreplied = turn
                turn = -1
            if m.content is None and not (m.tool_calls or m.refusal or m.reasoning_content or m.thinking_blocks):
                # An empty turn: OpenAI refuses it, and the kinds with their own bodies drop or refuse it.
                raise invalid_value(
                    f"'messages[{i}].content' is required on an assistant message without tool_calls",
                    "messages.content",
                )
            if m.tool_calls:
                said = True  # their ids go beside the rendered text
                for j, call in enumerate(m.tool_calls):
                    if not call.id:
                        raise _empty_id(f"messages[{i}].tool_calls[{j}].id", "messages.tool_calls.id")
                calls = frozenset(call.id for call in m.tool_calls)
                turn = i
                answered = set()
            if m.reasoning_content is not None or m.thinking_blocks is not None:
                back = True
            if m.refusal is not None:
                said = True
        elif m.__class__ is UserMessage and m.content.__class__ is list:
            images += image_parts(m.content)
        elif m.__class__ is ToolMessage:
            said = True  # its tool_call_id, as a call's id
            if not m.tool_call_id:
                raise _empty_id(f"messages[{i}].tool_call_id", "messages.tool_call_id")
            if m.tool_call_id not in calls:
                if unanswered is None:
                    unanswered = i
            elif turn >= 0:
                if m.tool_call_id not in answered:
                    answered.add(m.tool_call_id)
                elif repeated is None:
                    repeated = i
    # Calls the conversation ends on are marked apart: only a later message leaves them unanswered, and only
    # some servers refuse a conversation ending on them.
    opened = None
    if turn >= 0:
        if turn == len(req.messages) - 1:
            opened = turn
        elif unreplied is None and len(answered) < len(calls):
            unreplied = turn
    req.thinking_back = back
    # Refused where the route's server refuses them (providers/tool_results.py).
    req.unanswered, req.unreplied, req.repeated, req.open_calls = unanswered, unreplied, repeated, opened
    if req.continue_final_message is not None or req.add_generation_prompt is not None:
        _prefill(req)
    if req.echo_last is False:
        req.echo_last = None  # the default: one cache entry for both
    req.prompt = render(req.messages)
    normalize(req, caps)
    # Always set (a client's own " unrendered" never stands), once its fields are checked and folded; the
    # common request (a conversation alone) without a call.
    beside = images or back or said or chat_beside(req) != NOTHING_BESIDE
    req.unrendered = unrendered(req, images, caps.image_tokens, back or said) if beside else None
    if req.echo_last:
        _bound_echo(req, caps.emulated_answer_bytes)
    return req


__all__ = ["normalize_chat"]
