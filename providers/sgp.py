"""Scale GenAI Platform `POST /v4/beta/completions` (seed 003) as an upstream: `x-api-key` auth, a
string prompt, llm-engine's field names, and `logprobs` as a boolean with `top_logprobs` as the count.

Chat is SGP's `POST /v4/beta/chat/completions` (its SDK's `beta.chat.completions.create`): OpenAI's chat
request and answer, with the same llm-engine sampling fields as the completion route.
"""

from __future__ import annotations

from typing import Any, ClassVar

from providers.base import Endpoint, Param, table
from providers.chat_params import chat_table
from providers.openai_chat import OpenAIChat
from providers.openai_compat import OpenAICompatible


def _logprobs(body: dict[str, Any], count: int) -> None:
    body["logprobs"] = True
    if count:
        body["top_logprobs"] = count


class SGPAdapter(OpenAIChat, OpenAICompatible):
    kind = "sgp"
    auth = "`x-api-key`"
    needs_base_url = True
    credential_headers = frozenset({"x-api-key"})
    path: ClassVar[str] = "/v4/beta/completions"
    max_logprobs = 20
    prompt_forms = frozenset({"text"})
    params = table(
        max_tokens=Param(),
        temperature=Param(),
        top_p=Param(),
        top_k=Param(),
        n=Param(),
        best_of=Param(),
        stop=Param(),
        include_stop_str_in_output=Param(),
        logprobs=Param(apply=_logprobs),
        suffix=Param(),
        seed=Param(),
        logit_bias=Param(),
        frequency_penalty=Param(),
        presence_penalty=Param(),
        response_format=Param(),
        guided_json=Param(),
        guided_regex=Param(),
        guided_choice=Param(),
        guided_grammar=Param(),
        user=Param(),
        audio=Param(),
        modalities=Param(),
        tools=Param(),
        tool_choice=Param(),
        parallel_tool_calls=Param(),
        prediction=Param(),
    )

    chat_path: ClassVar[str] = "/v4/beta/chat/completions"
    chat_params = chat_table(params, chat_template_kwargs=Param())  # sgp-python's chat `create`

    def auth_headers(self, endpoint: Endpoint) -> dict[str, str]:
        return {"x-api-key": endpoint.api_key} if endpoint.api_key else {}
