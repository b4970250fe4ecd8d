"""Wire types: the one Completion request every dialect decodes into, and the one Completion shape out.

Every dialect (OpenAI, Fireworks, SGP, PAIS) decodes into the same union `CompletionRequest` in one
`msgspec` pass; `gateway.path.request.normalize` then folds the alias names (`max_new_tokens`,
`stop_sequences`, boolean `logprobs`...) into the canonical ones, so adapters only ever read canonical
fields. Ranges that msgspec can check are declared here as `Meta` constraints so the decoder rejects
them with a JSON path we turn into the `param` of the error.
"""

from __future__ import annotations

import functools
import typing
from collections.abc import Callable
from typing import Annotated, Any, Final, Literal

import msgspec
from msgspec import Meta

from wire.errors import InvalidRequestError

Temperature = Annotated[float, Meta(ge=0, le=2)]
Penalty = Annotated[float, Meta(ge=-2, le=2)]
Probability = Annotated[float, Meta(ge=0, le=1)]
# Every integer a request carries fits in 64 signed bits, as every upstream, the cache's key and the
# budgets' arithmetic take it: JSON itself has no bound, and a 400-digit `seed` is refused naming it.
INT64_MIN: Final = -(2**63)
INT64_MAX: Final = 2**63 - 1
Int64 = Annotated[int, Meta(ge=INT64_MIN, le=INT64_MAX)]
Count = Annotated[int, Meta(ge=0, le=INT64_MAX)]
CountOrAll = Annotated[int, Meta(ge=-1, le=INT64_MAX)]  # -1: the whole (vLLM's and llama.cpp's meaning)
PositiveInt = Annotated[int, Meta(ge=1, le=INT64_MAX)]
TokenId = Count
# Absolute bounds, whatever the provider: each provider's own (OpenAI: 4 stops and 5 logprobs; vLLM: no stop
# limit and 20 logprobs, or its configured `max_logprobs`) is checked after routing (providers/base.py
# `Capabilities`), and stops beyond a provider's count are enforced by the gateway. These only keep the
# decoder from accepting absurd values: a stop list the gateway may have to scan for, a logprobs count no
# server is configured for.
MAX_STOPS: Final = 64
MAX_LOGPROBS: Final = 100
LogprobsCount = Annotated[int, Meta(ge=0, le=MAX_LOGPROBS)]
StopList = Annotated[list[str], Meta(max_length=MAX_STOPS)]
PromptItem = str | Int64 | list[Int64]
# A prefix-cache salt: vLLM hashes it into its block hashes and has failed on odd values, so only a bounded
# token of URL- and base64-safe characters passes (`\Z`, not `$`: msgspec searches, and `$` also matches before
# a final newline).
CacheSalt = Annotated[str, Meta(min_length=1, max_length=256, pattern=r"\A[A-Za-z0-9._:/+=-]+\Z")]


# OpenAI's bounds on `metadata`: at most 16 pairs, keys of at most 64 characters, values of at most 512.
Metadata = Annotated[
    dict[Annotated[str, Meta(max_length=64)], Annotated[str, Meta(max_length=512)]], Meta(max_length=16)
]


class StreamOptions(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    include_usage: bool | None = None
    # OpenAI's random padding of stream chunks: the gateway writes its own chunks, which carry none.
    include_obfuscation: bool | None = None


class Unrendered(msgspec.Struct, frozen=True, gc=False):
    """What a request sends upstream beside the text `prompt` holds (a chat's rendered conversation), as token
    limits and budgets count it: the text of its tools, schemas, suffix and thinking sent back, counted as the
    prompt's text is, and its images' allowance in tokens (`caps.image_tokens` each). `largest`: the request
    field that carries the most of it, as the client names it (what a refusal over a token limit names)."""

    text: str
    image_tokens: int
    largest: str = ""


class CompletionRequest(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """The union of every request field in the seeds (docs/providers.md §1a), and the self-hosted servers'
    own sampling fields."""

    model: str
    prompt: str | list[PromptItem]
    # Token limit: four names, one meaning; normalize() enforces agreement.
    max_tokens: Count | None = None
    max_new_tokens: Count | None = None
    max_completion_tokens: Count | None = None
    temperature: Temperature | None = None
    top_p: Probability | None = None
    top_k: CountOrAll | None = None
    frequency_penalty: Penalty | None = None
    presence_penalty: Penalty | None = None
    n: PositiveInt | None = None
    best_of: PositiveInt | None = None
    stop: str | StopList | None = None
    stop_sequences: StopList | None = None
    include_stop_str_in_output: bool | None = None
    logprobs: bool | LogprobsCount | None = None
    top_logprobs: LogprobsCount | None = None
    return_token_log_probs: bool | None = None
    echo: bool | None = None
    suffix: str | None = None
    seed: Int64 | None = None
    logit_bias: dict[str, Annotated[float, Meta(ge=-100, le=100)]] | None = None
    response_format: dict[str, Any] | None = None
    guided_json: dict[str, Any] | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    images: list[str] | None = None
    context_length_exceeded_behavior: Literal["truncate", "error"] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    user: str | None = None
    inference_timeout: Annotated[float, Meta(gt=0)] | str | None = None
    inference_extra_params: dict[str, Any] | None = None
    inference_extra_headers: dict[str, str] | None = None
    # What goes upstream beside the prompt and is billed with it (tools, schemas, a suffix, images...), as limits
    # and budgets count it: set by normalize from the other fields, under a name no client sends (one that sends
    # it anyway is overwritten), None for a prompt alone. Not a parameter: no provider maps it.
    unrendered: Unrendered | None = msgspec.field(default=None, name=" unrendered")
    # Chat-oriented fields SGP also accepts on completions; only providers that declare them take them.
    audio: dict[str, Any] | None = None
    modalities: list[Literal["text", "audio"]] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    prediction: dict[str, Any] | None = None
    # How much a reasoning model thinks before it answers: OpenAI's values (openai-python `ReasoningEffort`);
    # each model takes its own subset, which the provider checks.
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = None
    verbosity: Literal["low", "medium", "high"] | None = None  # how long an answer (OpenAI's GPT-5 family)
    # OpenAI's own service (openai-python `completion_create_params.py` of `chat`): stored completions and
    # their metadata, the processing tier, the prompt-cache routing key, the end-user id for abuse checks,
    # web search; sent to the kinds that are OpenAI's API, refused by name elsewhere (`store: false`, what
    # every other provider does anyway, is taken everywhere).
    store: bool | None = None
    metadata: Metadata | None = None
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    web_search_options: dict[str, Any] | None = None
    # Self-hosted servers' own sampling fields (what lm-eval's `--gen_kwargs` and the SDKs' `extra_body`
    # send), typed as vLLM's completions protocol declares them. Each provider's table says where a field
    # goes (vLLM's body, TGI's `parameters`, Ollama's `options`, llama.cpp under its own name); elsewhere it
    # is refused or dropped like any field. One name per meaning: llama.cpp's and Ollama's `repeat_penalty`
    # is `repetition_penalty` here, TGI's `truncate` is `truncate_prompt_tokens`; names whose meaning
    # differs between servers (TGI's `best_of`, llama.cpp's `n_probs`) are not accepted here.
    min_p: Probability | None = None
    typical_p: Probability | None = None
    repetition_penalty: Annotated[float, Meta(gt=0)] | None = None
    repeat_last_n: CountOrAll | None = None
    min_tokens: Count | None = None
    ignore_eos: bool | None = None
    stop_token_ids: list[TokenId] | None = None
    allowed_token_ids: list[TokenId] | None = None
    skip_special_tokens: bool | None = None
    spaces_between_special_tokens: bool | None = None
    add_special_tokens: bool | None = None
    truncate_prompt_tokens: CountOrAll | None = None
    prompt_logprobs: LogprobsCount | None = None
    use_beam_search: bool | None = None
    length_penalty: float | None = None
    mirostat: Literal[0, 1, 2] | None = None
    mirostat_tau: Annotated[float, Meta(ge=0)] | None = None
    mirostat_eta: Annotated[float, Meta(ge=0)] | None = None
    num_ctx: PositiveInt | None = None
    watermark: bool | None = None
    # Token-native answers (vLLM and SGLang, for RL rollouts and evaluation): each choice's generated
    # `token_ids` and its `prompt_token_ids`, relayed untouched; `return_tokens_as_token_ids` writes
    # logprobs tokens as `token_id:<id>`; `priority` is the engine's scheduling priority; `cache_salt`
    # isolates the request's prefix-cache entries; `include_stop_reason` relays which stop string or token
    # id ended each choice (`stop_reason`). Elsewhere each is refused naming it.
    return_token_ids: bool | None = None
    return_tokens_as_token_ids: bool | None = None
    priority: Annotated[int, Meta(ge=-(2**31), le=2**31 - 1)] | None = None
    cache_salt: CacheSalt | None = None
    include_stop_reason: bool | None = None
    # The chat template's own variables (vLLM's, SGLang's and llama-server's chat routes: Qwen3's
    # `enable_thinking`), never a template: a `chat_template` inside is refused (gateway/path/request.py).
    chat_template_kwargs: dict[str, Any] | None = None
    # Chat's assistant prefill (wire.chat.ChatRequest takes them from clients): no completion's field.
    continue_final_message: bool | None = msgspec.field(default=None, name=" continue_final_message")
    add_generation_prompt: bool | None = msgspec.field(default=None, name=" add_generation_prompt")


def no_chat_template(kwargs: object, at: str = "") -> None:
    """A template's variables (`chat_template_kwargs`, at `at`) may not carry a template: vLLM, SGLang and
    other renderers take a `chat_template` among them as the template to render, and a Jinja template from a
    request can keep a shared server's CPU busy for as long as it likes (CVE-2025-61620)."""
    if isinstance(kwargs, dict) and "chat_template" in kwargs:
        name = f"{at}chat_template_kwargs.chat_template"
        message = f"'{name}' may not be set: a chat template is the server's configuration"
        raise InvalidRequestError(message, param=name, code="invalid_value")


_CONTAINERS: Final = (dict, list)


def check_depth(value: Any, limit: int, field: str, param: str | None = None) -> None:
    """Refuse JSON nested more than `limit` levels (the field's own value is level 1): one pass over the
    field's containers, level by level, without recursion. `param` is the error's field path when `field`
    names an item of a list (`messages[3].parsed` is `messages.parsed`)."""
    level: list[Any] = [value]
    depth = 1
    while True:
        nested: list[Any] = []
        for node in level:
            for child in node.values() if isinstance(node, dict) else node:
                if isinstance(child, _CONTAINERS):
                    nested.append(child)
        if not nested:
            return
        depth += 1
        if depth > limit:
            raise InvalidRequestError(
                f"'{field}' is nested more than {limit} levels deep", param=param or field, code="too_deeply_nested"
            )
        level = nested


# The self-hosted servers' own fields, declared last in CompletionRequest.
NATIVE_FIELDS: Final = CompletionRequest.__struct_fields__[CompletionRequest.__struct_fields__.index("min_p") :]
# The union's fields no completion client can send: chat's own, named with a leading space here
# (wire.chat.ChatRequest takes them from clients under their names).
CHAT_ONLY_FIELDS: Final = frozenset(
    f.name
    for f in msgspec.structs.fields(CompletionRequest)
    if f.encode_name.startswith(" ") and f.name != "unrendered"
)


class Logprobs(msgspec.Struct):
    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None] | None
    text_offset: list[int]


FinishReason = Literal["stop", "length", "content_filter"]


class Choice(msgspec.Struct, omit_defaults=True):
    text: str
    index: int
    logprobs: Logprobs | None
    finish_reason: FinishReason | None
    # vLLM's answer to its own `prompt_logprobs` (per prompt token: null for the first, else
    # {token_id: {logprob, rank, decoded_token}}), relayed as vLLM sends it; absent unless asked for.
    prompt_logprobs: list[dict[str, Any] | None] | None = None
    # vLLM's and SGLang's token-native answer (`return_token_ids`): the generated ids (a stream chunk's own
    # delta) and the prompt's ids, relayed as the engine sent them; absent unless asked for.
    token_ids: list[int] | None = None
    prompt_token_ids: list[int] | None = None
    # The stop string or token id that ended the choice (vLLM's `stop_reason`, SGLang's `matched_stop`),
    # when the request set `include_stop_reason`.
    stop_reason: int | str | None = None


# Usage and its details hold numbers only, so they can be in no cycle: not tracked by the collector
# (`gc=False`). A cached answer keeps its usage for as long as it is stored, and a tracked object kept
# counts toward the next young collection, which walks every request in flight.
class CompletionTokensDetails(msgspec.Struct, omit_defaults=True, gc=False):
    accepted_prediction_tokens: int | None = None
    audio_tokens: int | None = None
    reasoning_tokens: int | None = None
    rejected_prediction_tokens: int | None = None


class PromptTokensDetails(msgspec.Struct, omit_defaults=True, gc=False):
    audio_tokens: int | None = None
    cached_tokens: int | None = None


class Usage(msgspec.Struct, omit_defaults=True, gc=False):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    completion_tokens_details: CompletionTokensDetails | None = None
    prompt_tokens_details: PromptTokensDetails | None = None


class Completion(msgspec.Struct, omit_defaults=True, tag_field="object", tag="text_completion"):
    """The seeds' Completion; streamed chunks share the shape (seed 002).

    `object` is the struct's tag, so it is always written (omit_defaults would drop a default field).
    """

    id: str
    created: int
    model: str
    choices: list[Choice]
    system_fingerprint: str | None = None
    usage: Usage | None = None


class ModelCard(msgspec.Struct, tag_field="object", tag="model"):
    id: str
    owned_by: str
    created: int = 0


class ModelList(msgspec.Struct, tag_field="object", tag="list"):
    data: list[ModelCard]


class BodyError(msgspec.DecodeError):
    """A body msgspec cannot decode for a reason it does not report as a DecodeError (invalid UTF-8 in a
    string, nesting beyond the interpreter's recursion limit), with the top-level field it was found in."""

    def __init__(self, message: str, param: str | None, kind: str) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.kind = kind


# Free-form JSON fields: the only ones whose nesting the decoder does not bound by their type.
FREE_FORM: Final = (
    "response_format",
    "guided_json",
    "inference_extra_params",
    "audio",
    "tools",
    "tool_choice",
    "prediction",
    "web_search_options",
    "chat_template_kwargs",
)
_FIELDS: Final = msgspec.json.Decoder(dict[str, msgspec.Raw])
_decode_request = msgspec.json.Decoder(CompletionRequest).decode


def _utf8_field(raw: bytes) -> str | None:
    """The top-level field whose value holds invalid UTF-8 (error path only: one shallow decode)."""
    try:
        fields = _FIELDS.decode(raw)
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
        return None
    for name, value in fields.items():
        try:
            bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            return name
    return None


@functools.cache
def _probe(passed: frozenset[str]) -> msgspec.json.Decoder[Any]:
    # Keyed by a set, not the order fields came in: at most 2**7 decoders, whatever clients send.
    # The request's own fields and types, except that a free-form field not yet passed must be null: the
    # decoder stops at the first such field's opening bracket instead of descending into it.
    hints = typing.get_type_hints(CompletionRequest, include_extras=True)
    fields = [
        (name, None if name in FREE_FORM and name not in passed else hints[name], None)
        for name in CompletionRequest.__struct_fields__
    ]
    return msgspec.json.Decoder(msgspec.defstruct("Probe", fields, forbid_unknown_fields=True))


def _deep_field(raw: bytes) -> str | None:
    """The free-form field nested past the recursion limit (error path only: a few shallow decodes).

    Only free-form fields can nest without a type stopping them, so the first one in document order that
    the decoder cannot descend into is the culprit."""
    passed: tuple[str, ...] = ()
    for _ in range(len(FREE_FORM) + 1):
        try:
            _probe(frozenset(passed)).decode(raw)
        except msgspec.ValidationError as exc:
            at = str(exc).rpartition("at `$.")[2].rstrip("`")
            if at not in FREE_FORM or at in passed:
                return None
            passed = (*passed, at)
        except RecursionError:
            return passed[-1] if passed else None
        except (msgspec.DecodeError, UnicodeDecodeError):
            return None
        else:
            return None
    return None


def _invalid_utf8(exc: Exception) -> bool:
    """msgspec 0.23 and later report invalid UTF-8 as a DecodeError of their own (earlier releases let
    Python's UnicodeDecodeError through): either way it is the field's UTF-8 the client is told about."""
    return not isinstance(exc, msgspec.ValidationError) and "UTF-8" in str(exc)


def decode_request(raw: bytes) -> CompletionRequest:
    """One msgspec decode; a body it fails on in a way other than a DecodeError or ValidationError becomes a
    DecodeError too, so every undecodable body is a 400 and never a 500."""
    try:
        return _decode_request(raw)
    except (UnicodeDecodeError, RecursionError, msgspec.DecodeError) as exc:
        raise refused(exc, raw) from None


_T = typing.TypeVar("_T")


def decode_body(decode: Callable[[bytes], _T], raw: bytes) -> _T:
    """`decode(raw)` for any other client body (the tokenizer routes, the model-scoped path), with the
    same checks as `decode_request`: invalid UTF-8 and nesting past the recursion limit are BodyErrors."""
    try:
        return decode(raw)
    except (UnicodeDecodeError, RecursionError, msgspec.DecodeError) as exc:
        raise refused(exc, raw) from None


def refused(exc: Exception, raw: bytes) -> msgspec.DecodeError:
    """What a failed decode of `raw` is answered with: invalid UTF-8 and nesting past the recursion limit as
    BodyErrors naming their field, any other DecodeError (a ValidationError too) as it is."""
    if isinstance(exc, RecursionError):
        return _depth_error(raw)
    if isinstance(exc, UnicodeDecodeError) or _invalid_utf8(exc):
        return _utf8_error(raw)
    assert isinstance(exc, msgspec.DecodeError)
    return exc


def _utf8_error(raw: bytes) -> BodyError:
    field = _utf8_field(raw)
    where = f"'{field}'" if field else "the request body"
    return BodyError(f"Invalid value for {where}: it is not valid UTF-8", field, "invalid_utf8")


def _depth_error(raw: bytes) -> BodyError:
    field = _deep_field(raw)
    where = f"'{field}'" if field else "The request body's JSON"
    return BodyError(f"{where} is nested too deeply", field, "too_deeply_nested")


encode = msgspec.json.Encoder().encode
