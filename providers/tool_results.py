"""A tool message that answers no call of its turn, refused before any call on the routes whose servers refuse it.

A tool message names the call it answers by `tool_call_id`, and that call must be one of the nearest assistant
message before it that has tool calls. OpenAI and Azure answer a 400 ("Invalid parameter: 'tool_call_id' of ...
not found in 'tool_calls' of previous message."), Anthropic a 400 ("unexpected `tool_use_id` found in
`tool_result` blocks"), Bedrock's Converse a ValidationException, Mistral a 400 ("Unexpected tool call id"), and
Gemini, which pairs results with calls by function name, refuses a turn whose results do not match its calls.
Those routes declare it (`OpenAIChat.chat_results_paired`) and the gateway refuses such a conversation first, in
the client's terms, naming the message; the self-hosted servers (vLLM, SGLang, llama-server, TGI, Ollama) render
any conversation into their chat template, and get it as it is, as do the routes nobody has seen refuse it.
"""

from __future__ import annotations

from wire.chat import AssistantMessage, ChatRequest, ToolMessage
from wire.errors import InvalidRequestError


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
        f"Invalid parameter: 'messages[{at}].tool_call_id' of '{m.tool_call_id}' {where}; provider '{provider}' "
        "refuses a tool message that does not answer a call of the nearest assistant message with tool calls",
        param="messages.tool_call_id",
        code="invalid_value",
        elsewhere=True,
        cools=False,
    )
    error.no_call = True  # refused before any call: the failover loop counts no attempt
    return error


__all__ = ["unanswered_result"]
