"""Together `POST /v1/completions`.

Fields from together-python `types/completions.py` and a recorded request (its own `repetition_penalty`
and `min_p` included; it documents no stop count, so OpenAI's 4 apply); the response quirks
(`text.completion`, finish reason `eos`, float logprobs in stream chunks) are normalized by the base. Its
chat route takes and answers logprobs in its own shape too (providers/chat_logprobs.py). Together answers
`echo` beside the choices, not in their text, so the gateway echoes (docs/provider-notes.md).
"""

from __future__ import annotations

from typing import Any

from providers.base import EMULATED, Param, table
from providers.chat_params import chat_table
from providers.openai_chat import OpenAIChat
from providers.openai_compat import OPENAI_PARAMS, OpenAICompatible


def _chat_logprobs(body: dict[str, Any], count: int) -> None:
    # Together's chat `logprobs` is the count of alternatives per token (together-python
    # `ChatCompletionRequest.logprobs: int`), not OpenAI's boolean and `top_logprobs`; 1 at the least, as 0
    # would ask for none at all. Its answer's maps are cut back to `count` (providers/chat_logprobs.py).
    body["logprobs"] = max(count, 1)


class TogetherAdapter(OpenAIChat, OpenAICompatible):
    kind = "together"
    default_base_url = "https://api.together.xyz/v1"
    model_listing = ("/models", False)
    # Together's `logprobs` is an integer from 0 to 20 (its OpenAPI spec), not OpenAI's 5.
    max_logprobs = 20
    # Together always sends usage on the final chunk and documents no stream_options.
    stream_usage = False
    params = table(
        OPENAI_PARAMS,
        drop=("best_of", "suffix", "seed", "user"),
        # Together puts an echoed prompt (and its logprobs) in the answer's top-level `prompt` list, never in a
        # choice's text (its OpenAPI spec, `CompletionResponse.prompt`): the gateway prepends it itself.
        echo=EMULATED,
        top_k=Param(),
        repetition_penalty=Param(),
        min_p=Param(),
    )
    chat_params = chat_table(params, reasoning_effort=Param(), logprobs=Param(apply=_chat_logprobs))
    chat_stream_usage = False  # as on completions: its usage comes on the last chunk unasked
    # Its OpenAPI spec (`ChatCompletion{System,User,Assistant}MessageParam`): a `name` on those three roles,
    # no developer message, and an assistant's content a string without `refusal`.
    chat_names = frozenset({"system", "user", "assistant"})
