"""OpenAI `POST /v1/completions`: the reference dialect, every field passes as-is."""

from __future__ import annotations

from providers.base import Param
from providers.chat_params import chat_table
from providers.openai_chat import OpenAIChat
from providers.openai_compat import OpenAICompatible


class OpenAIAdapter(OpenAIChat, OpenAICompatible):
    kind = "openai"
    default_base_url = "https://api.openai.com/v1"
    openai_bpe = True
    model_listing = ("/models", False)
    chat_refusal = True  # its own field: an assistant message's `refusal` goes back as it came
    chat_results_paired = True  # "'tool_call_id' of ... not found in 'tool_calls' of previous message"
    # OpenAI's current name for the limit (o-series models refuse `max_tokens`).
    chat_params = chat_table(
        OpenAICompatible.params,
        max_tokens=Param(to="max_completion_tokens"),
        audio=Param(),
        modalities=Param(),
        prediction=Param(),
        reasoning_effort=Param(),
        verbosity=Param(),
        store=Param(),
        metadata=Param(),
        service_tier=Param(),
        prompt_cache_key=Param(),
        safety_identifier=Param(),
        web_search_options=Param(),
    )
