"""Requests built the way the pipeline builds them, for the pure adapter tests (no sockets)."""

from __future__ import annotations

import json
from typing import Any

import msgspec

from gateway.path.request import normalize
from providers.base import PARAM_FIELDS, Adapter, CallContext, Endpoint, UpstreamRequest, map_params
from wire.schema import CHAT_ONLY_FIELDS, CompletionRequest, decode_request


def request(model: str = "vendor/model", prompt: Any = "Say this is a test", **fields: Any) -> CompletionRequest:
    """Decode a client JSON body and normalize it, as `Pipeline.complete` does."""
    raw = msgspec.json.encode({"model": model, "prompt": prompt, **fields})
    return normalize(decode_request(raw))


def build(
    adapter: Adapter, req: CompletionRequest, endpoint: Endpoint, *, drop: bool = False
) -> tuple[UpstreamRequest, dict[str, Any], list[str]]:
    """check + map_params + build_request; returns the request, its decoded JSON body and what was dropped."""
    adapter.check(req, endpoint.provider)
    params, dropped = map_params(req, adapter.params, endpoint.provider, drop)
    up = adapter.build_request(req, endpoint, params)
    body: dict[str, Any] = json.loads(up.body)
    return up, body, dropped


def context(
    prompts: list[str] | None = None,
    *,
    n: int = 1,
    echo: bool = False,
    model: str = "client/model-string",
    logprobs: bool = False,
) -> CallContext:
    return CallContext(
        id="cmpl-gateway-test-id",
        created=1_700_000_000,
        model=model,
        prompts=prompts,
        n=n,
        echo=echo,
        logprobs=logprobs,
    )


def as_json(value: Any) -> Any:
    """The client-facing JSON of a gateway struct, decoded for exact dict comparisons."""
    return json.loads(msgspec.json.encode(value))


def chunked(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


# A valid value for each request field, for the tests that check a provider refuses or emulates it.
SAMPLE: dict[str, Any] = {
    "n": 2,
    "best_of": 3,
    "echo": True,
    "include_stop_str_in_output": True,
    "guided_json": {"type": "object"},
    "guided_regex": "[a-z]+",
    "guided_choice": ["yes", "no"],
    "guided_grammar": "root ::= 'a'",
    "frequency_penalty": 0.5,
    "presence_penalty": -0.5,
    "logprobs": 3,
    "top_k": 40,
    "user": "u-1",
    "suffix": "}",
    "seed": 7,
    "logit_bias": {"50256": -100},
    "response_format": {"type": "json_object"},
    "images": ["data:image/png;base64,AAAA"],
    "context_length_exceeded_behavior": "error",
    "audio": {"voice": "alloy"},
    "modalities": ["text"],
    "tools": [{"type": "function"}],
    "tool_choice": "auto",
    "parallel_tool_calls": True,
    "prediction": {"type": "content"},
    "reasoning_effort": "high",
    "verbosity": "low",
    "store": True,
    "metadata": {"team": "a"},
    "service_tier": "flex",
    "prompt_cache_key": "k-1",
    "safety_identifier": "u-1",
    "web_search_options": {},
}

# A valid value for each self-hosted server's own sampling field (wire/schema.py), which providers
# without such a field refuse.
NATIVE: dict[str, Any] = {
    "min_p": 0.05,
    "typical_p": 0.9,
    "repetition_penalty": 1.1,
    "repeat_last_n": 64,
    "min_tokens": 2,
    "ignore_eos": True,
    "stop_token_ids": [2],
    "allowed_token_ids": [5, 6],
    "skip_special_tokens": False,
    "spaces_between_special_tokens": False,
    "add_special_tokens": False,
    "truncate_prompt_tokens": 512,
    "prompt_logprobs": 1,
    "use_beam_search": True,
    "length_penalty": 0.8,
    "mirostat": 2,
    "mirostat_tau": 5.0,
    "mirostat_eta": 0.1,
    "num_ctx": 8192,
    "watermark": True,
    "return_token_ids": True,
    "return_tokens_as_token_ids": True,
    "priority": -1,
    "cache_salt": "salt-1",
    "include_stop_reason": True,
    "chat_template_kwargs": {"enable_thinking": False},
}
SAMPLE.update(NATIVE)


# The fields of OpenAI's and Fireworks' own services that every native-API kind (anthropic, bedrock, cohere,
# gemini, mistral) refuses on completions.
OPENAI_ONLY: tuple[str, ...] = (
    "images",
    "context_length_exceeded_behavior",
    "audio",
    "modalities",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "prediction",
    "verbosity",
    "store",
    "metadata",
    "service_tier",
    "prompt_cache_key",
    "safety_identifier",
    "web_search_options",
)


# The fields a completion table answers for: every one a completion client can send.
COMPLETION_FIELDS: tuple[str, ...] = tuple(f for f in PARAM_FIELDS if f not in CHAT_ONLY_FIELDS)


def sample(*fields: str) -> dict[str, Any]:
    """`SAMPLE` values for these fields."""
    return {f: SAMPLE[f] for f in fields}
