"""Finish reasons: every vendor's vocabulary folded into stop | length | content_filter.

One table for all providers, because the same words mean the same thing everywhere they appear
(TGI's `eos_token`, Together's `eos`, Anthropic's `end_turn`...). An empty string (TGI's intermediate
stream chunks) means "not finished yet".
"""

from __future__ import annotations

from typing import Final

from wire.errors import UpstreamError, UpstreamStatusError
from wire.schema import FinishReason

FINISH: Final[dict[str, FinishReason]] = {
    "stop": "stop",
    "eos": "stop",
    "eos_token": "stop",
    "stop_sequence": "stop",
    "end_turn": "stop",
    "tool_calls": "stop",
    "function_call": "stop",
    "length": "length",
    "max_tokens": "length",
    "model_length": "length",
    # Anthropic (handling-stop-reasons docs) and Cohere v2 (ChatFinishReason) words.
    "model_context_window_exceeded": "length",
    # llama.cpp /completion `stop_type` (tools/server/README.md): word = a stop string, limit = n_predict.
    "word": "stop",
    "limit": "length",
    "pause_turn": "stop",
    "tool_use": "stop",
    "complete": "stop",
    "tool_call": "stop",
    "content_filter": "content_filter",
    "refusal": "content_filter",
    # Gemini Candidate.FinishReason words for output stopped by a filter; its OTHER, LANGUAGE,
    # MALFORMED_FUNCTION_CALL... fall through to "stop" (neither the token limit nor a filter).
    "safety": "content_filter",
    "recitation": "content_filter",
    "blocklist": "content_filter",
    "prohibited_content": "content_filter",
    "spii": "content_filter",
    "image_safety": "content_filter",
    "image_prohibited_content": "content_filter",
    # AWS Bedrock Converse StopReason words for output stopped by a guardrail or a content filter.
    "guardrail_intervened": "content_filter",
    "content_filtered": "content_filter",
}


def finish_reason(raw: str | None) -> FinishReason | None:
    if not raw:
        return None
    # An unknown word still means the model stopped; "stop" is the least surprising reading.
    return FINISH.get(raw.lower(), "stop")


# Words for a generation the server gave up, whose text is partial: not an answer, and failing it lets
# another target give one. vLLM's `abort` (a shutdown, a pause, a scale-down: vllm-project/vllm #57082) and
# DeepSeek's `insufficient_system_resource` (its FinishReason enum: the inference system ran short).
ABORTED: Final = "abort"
BROKE_OFF: Final = frozenset({ABORTED, "insufficient_system_resource"})


def broke_off(provider: str, word: str = ABORTED) -> UpstreamStatusError:
    """The error for a choice whose finish reason says the generation did not end (no answer, nothing stored)."""
    return UpstreamStatusError(
        f"{provider} error: the generation ended with finish_reason '{word}'",
        upstream_status=502,
        provider=provider,
        code="generation_error",
    )


def unfinished(provider: str, index: int) -> UpstreamError:
    """The error for a buffered OpenAI-wire answer whose choice has no finish reason. Every recorded answer of
    OpenAI, Azure, vLLM, TGI, Together and Mistral carries one (OpenAI's schema requires it; SGLang and
    llama-server always set it on a finished request), so none means the generation did not end: the
    answer is what a stream that ends before its last choice finished is, and fails as that does (retried
    and failed over, nothing cached)."""
    return UpstreamError(
        f"{provider} error: choice {index} of the answer has no finish_reason: the upstream ended it early",
        code="upstream_stream_ended_early",
        retryable=True,
        cause="stream_ended_early",
        provider=provider,
    )
