"""Fireworks `POST /inference/v1/completions` (seed 001): OpenAI's fields plus its own extensions.

Fireworks keeps a matched stop sequence in its text ("The returned text will contain the stop sequence",
seed 001), so `stop_in_output` has the gateway cut it, as OpenAI does, or keep it on
`include_stop_str_in_output`.
"""

from __future__ import annotations

from typing import ClassVar

from providers.base import EMULATED, Param, table
from providers.chat_params import chat_table
from providers.openai_chat import OpenAIChat
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
        include_stop_str_in_output=EMULATED,
    )
    stop_in_output: ClassVar[bool] = True
    # Its priority tier on chat (docs.fireworks.ai, "Serverless Priority and Fast": `service_tier: "priority"`),
    # and OpenAI's cache-affinity key under OpenAI's name (a typed field of its SDK's chat request from
    # 1.2.0-alpha.76, beside its own `prompt_cache_isolation_key`; LiteLLM sends it as it came).
    chat_params = chat_table(params, reasoning_effort=Param(), service_tier=Param(), prompt_cache_key=Param())
    # Models with interleaved thinking read the earlier turns' `reasoning_content`, and the others ignore it
    # (docs.fireworks.ai, "Reasoning": agents must send it back in the turns that called tools).
    chat_reasoning_field = "reasoning_content"
