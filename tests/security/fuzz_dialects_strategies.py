"""Hypothesis strategies for the dialect fuzzing: requests over the union schema and raw hostile bodies."""

from __future__ import annotations

import json
from typing import Any, Final

import msgspec
from hypothesis import strategies as st

from wire.schema import CompletionRequest

# Strategies

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=30)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)

MODELS: Final = [
    "demo/text",
    "demo/text",
    "demo/echo",
    "demo/long",
    "demo/drip-1ms",
    "demo/slow-5ms",
    "demo/error-429",
    "demo/error-400",
    "demo/error-503",
    "up/davinci-002",
    "vl/facebook/opt-125m",
    "vl/facebook/opt-125m",
    "fast",
    "nope/x",
    "demo",
    "",
]
models = (
    st.sampled_from(MODELS)
    | st.sampled_from(MODELS)
    | st.text(max_size=20)
    | st.builds(lambda v, rest: f"{v}/{rest}", st.sampled_from(["demo", "up", "vl"]), st.text(max_size=20))
)
# Valid token counts include large ones: nothing in the schema bounds them.
small_ints = st.integers(min_value=0, max_value=64) | st.sampled_from([100_000, 2**31 - 1])
texts = st.text(max_size=40)
prompts = (
    texts
    | st.lists(texts, max_size=3)
    | st.lists(st.integers(min_value=-1, max_value=50_000), max_size=5)
    | st.lists(st.lists(st.integers(min_value=0, max_value=50_000), max_size=4), max_size=3)
)
schemas = st.fixed_dictionaries(
    {"type": st.sampled_from(["object", "string", "integer", "array"])},
    optional={
        "properties": st.dictionaries(st.text(max_size=5), st.just({"type": "string"}), max_size=2),
        "pattern": st.text(max_size=12),
        "enum": st.lists(json_scalars, max_size=3),
    },
)
# A valid (or nearly valid) value for each field; wild requests give fields any JSON value at all
# (wrong types, out-of-range and huge numbers, nesting) instead.
PLAUSIBLE: Final[dict[str, st.SearchStrategy[Any]]] = {
    "model": models,
    "prompt": prompts,
    "max_tokens": small_ints,
    "max_new_tokens": small_ints,
    "max_completion_tokens": small_ints,
    "temperature": st.floats(min_value=0, max_value=2),
    "top_p": st.floats(min_value=0, max_value=1),
    "top_k": st.integers(min_value=-1, max_value=50),
    "frequency_penalty": st.floats(min_value=-2, max_value=2),
    "presence_penalty": st.floats(min_value=-2, max_value=2),
    "n": st.integers(min_value=1, max_value=4) | st.just(100_000),
    "best_of": st.integers(min_value=1, max_value=4) | st.just(100_000),
    "stop": texts | st.lists(texts, max_size=4),
    "stop_sequences": st.lists(texts, max_size=4),
    "include_stop_str_in_output": st.booleans(),
    "logprobs": st.booleans() | st.integers(min_value=0, max_value=5),
    "top_logprobs": st.integers(min_value=0, max_value=20),
    "return_token_log_probs": st.booleans(),
    "echo": st.booleans(),
    "suffix": texts,
    "seed": st.integers(),
    "logit_bias": st.dictionaries(st.text(max_size=6), st.floats(min_value=-100, max_value=100), max_size=3),
    "response_format": st.fixed_dictionaries(
        {"type": st.sampled_from(["text", "json_object", "json_schema"])},
        optional={"json_schema": st.fixed_dictionaries({"name": texts, "schema": schemas})},
    ),
    "guided_json": schemas,
    "guided_regex": st.text(alphabet="ab()+*?|[]{}^$.\\0123456789", max_size=20),
    "guided_choice": st.lists(texts, max_size=4),
    "guided_grammar": texts,
    "images": st.lists(texts, max_size=2),
    "context_length_exceeded_behavior": st.sampled_from(["truncate", "error"]),
    "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries(
        {}, optional={"include_usage": st.booleans(), "include_obfuscation": st.booleans()}
    ),
    "user": texts,
    "inference_timeout": st.floats(min_value=0.5, max_value=30) | texts,
    "inference_extra_params": st.dictionaries(st.text(max_size=8), json_values, max_size=3),
    "inference_extra_headers": st.dictionaries(st.text(max_size=12), st.text(max_size=12), max_size=3),
    "audio": st.dictionaries(st.text(max_size=6), json_values, max_size=2),
    "modalities": st.lists(st.sampled_from(["text", "audio"]), max_size=2),
    "tools": st.lists(st.dictionaries(st.text(max_size=6), json_values, max_size=2), max_size=2),
    "tool_choice": st.sampled_from(["none", "auto", "required"]) | st.just({"type": "function"}),
    "parallel_tool_calls": st.booleans(),
    "prediction": st.dictionaries(st.text(max_size=6), json_values, max_size=2),
    "reasoning_effort": st.sampled_from(["none", "minimal", "low", "medium", "high", "xhigh", "max"]),
    "verbosity": st.sampled_from(["low", "medium", "high"]),
    "store": st.booleans(),
    "metadata": st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3),
    "service_tier": st.sampled_from(["auto", "default", "flex", "scale", "priority"]),
    "prompt_cache_key": st.text(max_size=12),
    "safety_identifier": st.text(max_size=12),
    "web_search_options": st.dictionaries(st.text(max_size=6), json_values, max_size=2),
    # Self-hosted servers' own sampling fields.
    "min_p": st.floats(min_value=0, max_value=1),
    "typical_p": st.floats(min_value=0, max_value=1),
    "repetition_penalty": st.floats(min_value=0.5, max_value=2),
    "repeat_last_n": st.integers(min_value=-1, max_value=64),
    "min_tokens": small_ints,
    "ignore_eos": st.booleans(),
    "stop_token_ids": st.lists(st.integers(min_value=0, max_value=50_000), max_size=3),
    "allowed_token_ids": st.lists(st.integers(min_value=0, max_value=50_000), max_size=3),
    "skip_special_tokens": st.booleans(),
    "spaces_between_special_tokens": st.booleans(),
    "add_special_tokens": st.booleans(),
    "truncate_prompt_tokens": st.integers(min_value=-1, max_value=4096),
    "prompt_logprobs": st.integers(min_value=0, max_value=5),
    "use_beam_search": st.booleans(),
    "length_penalty": st.floats(min_value=-2, max_value=2),
    "mirostat": st.sampled_from([0, 1, 2]),
    "mirostat_tau": st.floats(min_value=0, max_value=10),
    "mirostat_eta": st.floats(min_value=0, max_value=1),
    "num_ctx": st.integers(min_value=1, max_value=32_768),
    "watermark": st.booleans(),
    # Token-native answers (vLLM, SGLang).
    "return_token_ids": st.booleans(),
    "return_tokens_as_token_ids": st.booleans(),
    "priority": st.integers(min_value=-10, max_value=10),
    "cache_salt": st.sampled_from(["tenant-a", "", "a b", "run/17:x"]),
    "include_stop_reason": st.booleans(),
    # A chat template's variables; a template among them is refused.
    "chat_template_kwargs": st.dictionaries(st.text(max_size=8), json_values, max_size=2)
    | st.just({"chat_template": "{% for i in range(9) %}x{% endfor %}"}),
}
# A field named with a leading space is chat's alone (wire.chat.ChatRequest): no completion client can send it.
FIELDS: Final = [f.encode_name for f in msgspec.structs.fields(CompletionRequest) if not f.encode_name.startswith(" ")]
assert set(FIELDS) == set(PLAUSIBLE), "a new request field needs a plausible strategy here"

unknown_fields = st.dictionaries(
    st.text(min_size=1, max_size=10).filter(lambda k: k not in PLAUSIBLE), json_values, max_size=2
)


OPTIONAL: Final = [name for name in FIELDS if name not in ("model", "prompt")]


@st.composite
def requests(draw: st.DrawFn) -> bytes:
    """A JSON object over the union schema. Most carry a few fields with plausible values, so that
    answers (plain and streamed) are reached as often as refusals; some carry many, any of them with
    any JSON value at all, and unknown fields."""
    body: dict[str, Any] = {}
    wild = draw(st.integers(0, 3)) == 0
    for name in ("model", "prompt"):
        if draw(st.integers(0, 19)) > 0:
            body[name] = draw(PLAUSIBLE[name] | json_values) if wild else draw(PLAUSIBLE[name])
    chosen = draw(st.lists(st.sampled_from(OPTIONAL), unique=True, max_size=12 if wild else 4))
    for name in chosen:
        body[name] = draw(json_values) if wild and draw(st.booleans()) else draw(PLAUSIBLE[name])
    if not wild and draw(st.integers(0, 2)) == 0:
        body["stream"] = True
        if draw(st.booleans()):
            body["stream_options"] = {"include_usage": True}
    if wild and draw(st.booleans()):
        body.update(draw(unknown_fields))
    return json.dumps(body).encode()


_MODEL = st.sampled_from(["demo/text", "up/davinci-002", "vl/facebook/opt-125m", "fast"])


def _base(model: str) -> str:
    return f'{{"model": "{model}", "prompt": "hi", '


@st.composite
def invalid_utf8(draw: st.DrawFn) -> bytes:
    bad = draw(st.sampled_from([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80", b"\x80"]))
    where = draw(st.sampled_from(["prompt", "model", "user", "key"]))
    if where == "key":
        return b'{"model": "demo/text", "prompt": "hi", "' + bad + b'": 1}'
    body = {"model": draw(_MODEL), "prompt": "hi", where: "x"}
    return json.dumps(body).encode().replace(b'"x"', b'"x' + bad + b'"')


@st.composite
def deep_nesting(draw: st.DrawFn) -> bytes:
    depth = draw(st.sampled_from([5_000, 1_000, 200, 65, 50_000]))
    field = draw(st.sampled_from(["inference_extra_params", "response_format", "guided_json", "prompt", "stop"]))
    shape = draw(st.sampled_from(["dict", "list"]))
    inner = "[" * depth + "]" * depth if shape == "list" else '{"a":' * depth + "1" + "}" * depth
    if field == "prompt":
        return f'{{"model": "{draw(_MODEL)}", "prompt": {inner}}}'.encode()
    if field in ("response_format", "inference_extra_params", "guided_json") and shape == "list":
        inner = '{"a": ' + inner + "}"
    return (_base(draw(_MODEL)) + f'"{field}": {inner}}}').encode()


@st.composite
def huge_numbers(draw: st.DrawFn) -> bytes:
    field = draw(st.sampled_from(["max_tokens", "temperature", "n", "seed", "top_k", "logprobs", "best_of"]))
    number = draw(st.sampled_from(["1e400", "-1e400", "99999999999999999999999999", "-9" * 40, "1e-400", "0e0"]))
    return (_base(draw(_MODEL)) + f'"{field}": {number}}}').encode()


@st.composite
def non_finite(draw: st.DrawFn) -> bytes:
    field = draw(st.sampled_from(["temperature", "top_p", "max_tokens", "inference_timeout", "logit_bias"]))
    literal = draw(st.sampled_from(["NaN", "Infinity", "-Infinity", "nan", "inf"]))
    value = f'{{"1": {literal}}}' if field == "logit_bias" else literal
    return (_base(draw(_MODEL)) + f'"{field}": {value}}}').encode()


@st.composite
def duplicate_keys(draw: st.DrawFn) -> bytes:
    field = draw(st.sampled_from(["model", "prompt", "stream", "max_tokens"]))
    value = draw(st.sampled_from(['"nope/x"', "true", "3", '"y"', "null", "[]"]))
    return (_base(draw(_MODEL)) + f'"{field}": {value}, "{field}": {value}}}').encode()


@st.composite
def truncated(draw: st.DrawFn) -> bytes:
    whole = draw(requests())
    return whole[: draw(st.integers(0, max(len(whole) - 1, 0)))]


@st.composite
def huge_strings(draw: st.DrawFn) -> bytes:
    size = draw(st.sampled_from([100_000, 1_000_000]))
    field = draw(st.sampled_from(["prompt", "model", "stop", "user", "suffix"]))
    return json.dumps({"model": draw(_MODEL), "prompt": "hi", field: "a" * size}).encode()


@st.composite
def odd_model_names(draw: st.DrawFn) -> bytes:
    """Control characters and text beyond latin-1, where a model name may reach headers or URLs."""
    name = draw(st.text(alphabet=st.characters(codec="utf-8"), min_size=1, max_size=12))
    vendor = draw(st.sampled_from(["demo/", "up/", "vl/", ""]))
    return json.dumps({"model": vendor + name, "prompt": "x", "stream": draw(st.booleans())}).encode()


hostile = st.one_of(
    invalid_utf8(),
    deep_nesting(),
    huge_numbers(),
    non_finite(),
    duplicate_keys(),
    truncated(),
    st.builds(lambda v: json.dumps(v).encode(), json_values),  # JSON that is not an object
    huge_strings(),
    odd_model_names(),
    st.binary(max_size=200),
)
bodies = requests() | hostile
