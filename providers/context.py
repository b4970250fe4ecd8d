"""Context-window errors, recognized by their meaning whichever server words them.

A prompt that does not fit the model is one error to the client (`context_length_exceeded`, OpenAI's code)
and to the failover loop (only a larger-context fallback can help), whether it came from OpenAI's code, from
a server that speaks OpenAI's shape but words it its own way (llama-server behind a `vllm` provider), or
from a native API. Each server's wording, and where it comes from: docs/provider-notes.md#context-window.
"""

from __future__ import annotations

import re
from typing import Final

CONTEXT_CODE: Final = "context_length_exceeded"

# Codes and types that mean it: OpenAI's and llama-cpp-python's code, llama-server's error type.
_CODES: Final = frozenset({CONTEXT_CODE, "exceed_context_size_error"})
# Wordings, lower-cased: OpenAI and vLLM ("This model's maximum context length is N tokens"),
# llama-server ("request (N tokens) exceeds the available context size (M tokens)"), llama-cpp-python's
# library ("Requested tokens (N) exceed context window of M"), and vLLM's newer "longer than the maximum
# model length".
_WORDS: Final = re.compile(
    r"maximum context length"
    r"|exceeds the available context size"
    r"|exceed context window"
    r"|longer than the maximum model length"
    r"|context length exceeded"
)


def context_window(code: object, message: str) -> bool:
    """Whether an upstream error (its code or type, its message) says the prompt does not fit the model."""
    if isinstance(code, str) and code in _CODES:
        return True
    return _WORDS.search(message.lower()) is not None


__all__ = ["CONTEXT_CODE", "context_window"]
