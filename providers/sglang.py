"""SGLang's OpenAI-compatible server (`python -m sglang.launch_server`): `/v1/completions` plus its own fields.

Its sampling extras are read from `sglang/srt/entrypoints/openai/protocol.py` CompletionRequest: vLLM's
names where they mean the same (`top_k`, `min_p`, `min_tokens`, `repetition_penalty`, `stop_token_ids`,
`ignore_eos`, `skip_special_tokens`), its own for constrained decoding (`regex`, `ebnf`, and `json_schema`
as a JSON string), and the token-native fields: `return_token_ids` (each choice's `token_ids` and
`prompt_token_ids`), `priority` and `cache_salt`. What stopped a choice comes back as `matched_stop`,
relayed as `stop_reason` when the request sets `include_stop_reason`.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

import msgspec

from providers.base import Param, table
from providers.chat_params import chat_table, continuing
from providers.engine import SGLANG_GAUGES
from providers.openai_chat import OpenAIChat
from providers.openai_compat import OPENAI_PARAMS, OpenAICompatible, json_object_schema


def _json_schema(body: dict[str, Any], value: dict[str, Any]) -> None:
    body["json_schema"] = msgspec.json.encode(value).decode()


def _response_format(body: dict[str, Any], value: dict[str, Any]) -> None:
    schema = json_object_schema(value)  # SGLang's own response_format would drop it
    if schema is not None:
        _json_schema(body, schema)
    else:
        body["response_format"] = value


def _gateway_only(body: dict[str, Any], value: Any) -> None:
    # `include_stop_reason` asks the gateway to relay SGLang's `matched_stop`, which it always sends.
    return None


class SGLangAdapter(OpenAIChat, OpenAICompatible):
    kind = "sglang"
    needs_base_url = True
    model_listing = ("/models", True)  # base_url ends in /v1
    # Offsets are computed by the gateway: SGLang's own are not documented to count into prompt + text.
    openai_offsets = False
    auth = "`Authorization: Bearer` when api_key is set (`--api-key`)"
    needs_api_key = False
    max_stop = None
    max_logprobs = 20
    serves_replicas = True
    engine_gauges = SGLANG_GAUGES
    params = table(
        {
            **OPENAI_PARAMS,
            **dict.fromkeys(
                (
                    "top_k",
                    "min_p",
                    "min_tokens",
                    "repetition_penalty",
                    "stop_token_ids",
                    "ignore_eos",
                    "skip_special_tokens",
                    "return_token_ids",
                    "priority",
                    "cache_salt",
                ),
                Param(),
            ),
        },
        guided_regex=Param("regex"),
        guided_grammar=Param("ebnf"),
        guided_json=Param(apply=_json_schema),
        response_format=Param(apply=_response_format),
        include_stop_reason=Param(apply=_gateway_only),
    )
    # Its chat choices carry `matched_stop`, plain and streamed, as its completion choices do.
    # sglang `ChatCompletionRequest.continue_final_message`: the trailing assistant message is continued.
    chat_continue = MappingProxyType({"continue_final_message": True})
    # `return_token_ids` on chat (sglang `serving_chat.py`): each choice's `token_ids` and `prompt_token_ids`
    # (the gateway lifts the latter to the answer's top, vLLM's place); its chat route refuses it on a stream.
    chat_token_ids_streamed = False
    chat_params = chat_table(
        params,
        reasoning_effort=Param(),
        chat_template_kwargs=Param(),
        return_token_ids=params["return_token_ids"],
        include_stop_reason=params["include_stop_reason"],
        continue_final_message=continuing(chat_continue),
    )
    # protocol.py: `ChatCompletionMessageGenericParam` (system, developer, assistant, tool) has a `name`;
    # `ChatCompletionMessageUserParam` has none, and a user message's is dropped unread.
    chat_names = frozenset({"system", "developer", "assistant"})
    # sglang/srt/entrypoints/openai/protocol.py `ChatCompletionMessageGenericParam.reasoning_content`.
    chat_reasoning_field = "reasoning_content"
