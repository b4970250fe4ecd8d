"""Fireworks `POST /inference/v1/completions` (seed 001): OpenAI's fields plus its own extensions."""

from __future__ import annotations

from providers.base import Param, table
from providers.openai_chat import OpenAIChat, chat_table
from providers.openai_compat import OPENAI_PARAMS, OpenAICompatible


class FireworksAdapter(OpenAIChat, OpenAICompatible):
    kind = "fireworks"
    default_base_url = "https://api.fireworks.ai/inference/v1"
    model_listing = ("/models", False)
    # The seed documents neither best_of nor suffix for Fireworks.
    params = table(
        OPENAI_PARAMS,
        drop=("best_of", "suffix"),
        top_k=Param(),
        response_format=Param(),
        context_length_exceeded_behavior=Param(),
        images=Param(),
    )
    chat_params = chat_table(params, reasoning_effort=Param())
