"""Tool results that do not pair with their turn's calls, refused before any call on the routes whose servers do.

A tool message answers the call its `tool_call_id` names, one of the nearest assistant message before it with tool
calls; each of that turn's calls wants one result before the next assistant message. OpenAI and Azure refuse a
result answering no call, a call left without a result ("An assistant message with 'tool_calls' must be followed by
tool messages responding to each 'tool_call_id'") and two results for one call ("Duplicate value for
'tool_call_id'"); Anthropic each of the three (`tool_use` ids without `tool_result` blocks, "each tool_use must have
a single result"); Bedrock's Converse, Gemini and Mistral count a turn's results against its calls, and refuse a
mismatch. Those routes declare it (`OpenAIChat.chat_results_paired`) and the gateway refuses such a conversation
first, in the client's terms, naming the message; the self-hosted servers (vLLM, SGLang, llama-server, TGI,
Ollama) render any conversation into their chat template, and get it as it is, as do the unconfirmed routes.
Anthropic, Bedrock, Gemini and Mistral refuse a conversation ending on the calls too (`chat_open_calls_refused`).
"""

from __future__ import annotations

from wire.chat import ChatRequest
from wire.errors import SHOWN_CHARS, InvalidRequestError, shown
from wire.messages import AssistantMessage, ToolMessage

_RULE = "refuses a conversation whose tool messages do not answer each call of their turn once"


def check_results(req: ChatRequest, provider: str, open_refused: bool) -> None:
    """Refuse, on a route whose server would, the first of the pairing faults normalize_chat marked, and with
    `open_refused` the calls the conversation ends on (`open_calls`), as a call left without a result."""
    if req.unanswered is not None:
        raise unanswered_result(req, req.unanswered, provider)
    unreplied = req.unreplied
    if unreplied is None and open_refused:
        unreplied = req.open_calls
    if unreplied is not None:
        raise _refused(_unreplied(req, unreplied), "messages.tool_calls.id", provider)
    if req.repeated is not None:
        raise _refused(_repeated(req, req.repeated), "messages.tool_call_id", provider)


def unanswered_result(req: ChatRequest, at: int, provider: str) -> InvalidRequestError:
    """The 400 for `req.messages[at]`, a tool message that answers no call of its turn, on `provider`: another
    target of the plan whose server takes the conversation may still serve it."""
    m = req.messages[at]
    assert isinstance(m, ToolMessage)
    turn = next(
        (p for p in reversed(req.messages[:at]) if isinstance(p, AssistantMessage) and p.tool_calls),
        None,
    )
    where = (
        "not found in 'tool_calls' of the assistant message before it"
        if turn is not None
        else "answers no call: no assistant message before it has 'tool_calls'"
    )
    error = InvalidRequestError(
        f"Invalid parameter: 'messages[{at}].tool_call_id' of '{shown(m.tool_call_id)}' {where}; provider '{provider}' "
        "refuses a tool message that does not answer a call of the nearest assistant message with tool calls",
        param="messages.tool_call_id",
        code="invalid_value",
        elsewhere=True,
        cools=False,
    )
    error.no_call = True  # refused before any call: the failover loop counts no attempt
    return error


def _unreplied(req: ChatRequest, at: int) -> str:
    m = req.messages[at]
    assert isinstance(m, AssistantMessage) and m.tool_calls
    answered = set()
    for later in req.messages[at + 1 :]:
        if isinstance(later, AssistantMessage):
            break
        if isinstance(later, ToolMessage):
            answered.add(later.tool_call_id)
    missing = [(j, call.id) for j, call in enumerate(m.tool_calls) if call.id not in answered]
    j, first = missing[0]
    return (
        f"Invalid parameter: 'messages[{at}].tool_calls[{j}].id' of '{shown(first)}' has no tool message answering it; "
        "an assistant message with 'tool_calls' must be followed by tool messages responding to each "
        f"'tool_call_id'. The following tool_call_ids did not have response messages: "
        # Each id cut, and the list too: a turn may hold thousands of calls.
        + shown(", ".join(shown(call_id) for _, call_id in missing), 8 * SHOWN_CHARS)
    )


def _repeated(req: ChatRequest, at: int) -> str:
    m = req.messages[at]
    assert isinstance(m, ToolMessage)
    first = next(
        k
        for k in range(at - 1, -1, -1)
        if isinstance(p := req.messages[k], ToolMessage) and p.tool_call_id == m.tool_call_id
    )
    return (
        f"Invalid parameter: 'messages[{at}].tool_call_id' of '{shown(m.tool_call_id)}' answers the call that "
        f"messages[{first}] already answers; each call of a turn takes one tool message"
    )


def _refused(message: str, param: str, provider: str) -> InvalidRequestError:
    # As unanswered_result's: the server's rule, so another target of the plan may take the conversation.
    error = InvalidRequestError(
        f"{message}; provider '{provider}' {_RULE}", param=param, code="invalid_value", elsewhere=True, cools=False
    )
    error.no_call = True
    return error


__all__ = ["check_results", "unanswered_result"]
