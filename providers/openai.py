"""OpenAI `POST /v1/completions`: the reference dialect, every field passes as-is."""

from __future__ import annotations

from providers.openai_compat import OpenAICompatible


class OpenAIAdapter(OpenAICompatible):
    kind = "openai"
    default_base_url = "https://api.openai.com/v1"
    openai_bpe = True
    model_listing = ("/models", False)
