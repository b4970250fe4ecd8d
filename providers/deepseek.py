"""DeepSeek FIM completions (`/beta/completions`).

Under load DeepSeek pads responses with blank lines and streams `: keep-alive` comments; the shared
JSON and SSE decoders tolerate both.
"""

from __future__ import annotations

from providers.base import table
from providers.openai_chat import OpenAIChat, chat_table
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
