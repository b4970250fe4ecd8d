"""vLLM's OpenAI-compatible server.

vLLM >= 0.12 silently ignores the old `guided_*` fields (unknown fields are allowed), so a request
carrying them would come back 200 and unconstrained: they must become `structured_outputs.*`.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, Final

from providers.base import Param, table
from providers.chat_params import chat_table, continuing
from providers.engine import VLLM_GAUGES
from providers.openai_chat import OpenAIChat
from providers.openai_compat import OPENAI_PARAMS, OpenAICompatible, json_object_schema
from providers.tokenizer import VLLM_TOKENIZER


def _response_format(body: dict[str, Any], value: dict[str, Any]) -> None:
    schema = json_object_schema(value)
    if schema is not None:
        body.setdefault("structured_outputs", {})["json"] = schema
    else:
        body["response_format"] = value


# vLLM's own completions fields, passed as they are: the sampling parameters of
# `vllm/entrypoints/openai/protocol.py` CompletionRequest (`completion-sampling-params`) and its
# `add_special_tokens`. The answer to `prompt_logprobs` (`choices[].prompt_logprobs`) is relayed as it comes.
VLLM_NATIVE: Final = (
    "min_p",
    "repetition_penalty",
    "length_penalty",
    "use_beam_search",
    "stop_token_ids",
    "ignore_eos",
    "min_tokens",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "truncate_prompt_tokens",
    "allowed_token_ids",
    "prompt_logprobs",
    "add_special_tokens",
    "return_token_ids",
    "return_tokens_as_token_ids",
    "priority",
    "cache_salt",
)


def _gateway_only(body: dict[str, Any], value: Any) -> None:
    # `include_stop_reason` asks the gateway to relay vLLM's `stop_reason`, which vLLM always sends.
    return None


class VLLMAdapter(OpenAIChat, OpenAICompatible):
    kind = "vllm"
    needs_base_url = True
    model_listing = ("/models", True)  # base_url ends in /v1
    # vLLM's text_offset starts at 0 without echo (`_create_completion_logprobs(initial_text_offset=0)`).
    openai_offsets = False
    tokenizer = VLLM_TOKENIZER
    auth = "`Authorization: Bearer` when api_key is set"
    needs_api_key = False
    # vLLM takes any number of stop strings; 20 is its `--max-logprobs` default (`max_logprobs` in the config
    # when the server was started with another).
    max_stop = None
    max_logprobs = 20
    # vLLM also takes a prompt as embeddings (`prompt_embeds`).
    guarded_paths = OpenAICompatible.guarded_paths | {"prompt_embeds"}
    params = table(
        {**OPENAI_PARAMS, **dict.fromkeys(VLLM_NATIVE, Param())},
        top_k=Param(),
        include_stop_str_in_output=Param(),
        guided_json=Param("structured_outputs.json"),
        guided_regex=Param("structured_outputs.regex"),
        guided_choice=Param("structured_outputs.choice"),
        guided_grammar=Param("structured_outputs.grammar"),
        response_format=Param(apply=_response_format),
        include_stop_reason=Param(apply=_gateway_only),
    )
    serves_replicas = True
    engine_gauges = VLLM_GAUGES
    # The chat route's `continue_final_message` (vllm `ChatCompletionRequest`): the trailing assistant message
    # is left open and continued (a client's prefill, a broken stream's resumption); it excludes
    # `add_generation_prompt`, which a client may also set false on its own (the template's turn left unopened).
    chat_continue = MappingProxyType({"continue_final_message": True, "add_generation_prompt": False})
    # `return_token_ids` on chat (vllm `ChatCompletionRequest`): each choice's `token_ids` and the answer's
    # `prompt_token_ids` (a stream's first chunk), which the chat wire carries (wire/chat.py); its chat choices
    # carry `stop_reason` as its completion choices do; a buffered answer carries `prompt_logprobs` at its top
    # level (`ChatCompletionResponse.prompt_logprobs`).
    chat_params = chat_table(
        params,
        reasoning_effort=Param(),
        chat_template_kwargs=Param(),
        return_token_ids=params["return_token_ids"],
        include_stop_reason=params["include_stop_reason"],
        continue_final_message=continuing(chat_continue),
        add_generation_prompt=Param(),
        prompt_logprobs=params["prompt_logprobs"],
    )
    # vllm/entrypoints/chat_utils.py `CustomChatCompletionMessageParam.reasoning` ("for interleaved thinking"),
    # which the chat template sees.
    chat_reasoning_field = "reasoning"
