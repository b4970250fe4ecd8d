"""DeepSeek FIM completions (`/beta/completions`).

Under load DeepSeek pads responses with blank lines and streams `: keep-alive` comments; the shared
JSON and SSE decoders tolerate both.
"""

from __future__ import annotations

from typing import ClassVar

from providers.base import table
from providers.chat_params import chat_table
from providers.openai_chat import OpenAIChat
from providers.openai_compat import OPENAI_PARAMS, OpenAICompatible


class DeepSeekAdapter(OpenAIChat, OpenAICompatible):
    kind = "deepseek"
    default_base_url = "https://api.deepseek.com/beta"
    model_listing = ("/models", False)
    # api-docs.deepseek.com/api/create-completion: "Up to 16 sequences", logprobs "<= 20".
    max_stop = 16
    max_logprobs = 20
    params = table(OPENAI_PARAMS, drop=("n", "best_of", "seed", "logit_bias", "user"))
    chat_params = chat_table(params)
    # api-docs.deepseek.com/api/create-chat-completion: `response_format` is `text` or `json_object`, and the
    # API has no guided decoding a JSON schema could be sent as.
    chat_formats: ClassVar[frozenset[str]] = frozenset({"text", "json_object"})
    # api-docs.deepseek.com/guides/thinking_mode: a turn that called tools must come back with its
    # `reasoning_content` (else a 400); other turns' is ignored.
    chat_reasoning_field = "reasoning_content"
    # Its own 400s for a tool message after no `tool_calls` and for a call left without a result ("insufficient
    # tool messages following tool_calls message"); its answer to a call answered twice is undocumented, so the
    # conversation goes as it is (not `chat_results_paired`).
