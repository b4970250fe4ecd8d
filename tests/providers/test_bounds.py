"""Per-provider bounds and provider-native fields, as the adapters' tables declare them (issue 12, items 1-2).

Bounds: how many stop sequences each kind takes (the rest are enforced by the gateway) and how many logprobs
it returns (more is refused naming the provider and the bound; `max_logprobs` in the config overrides it).
Native fields: the self-hosted servers' own sampling fields reach each server where it reads them (vLLM's
body, TGI's `parameters`, Ollama's `options`, llama.cpp's names) and are refused, or dropped under the drop
policy, everywhere else.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from gateway import emulation
from gateway.config import CapsConfig, ConfigError, parse_config
from gateway.emulation import chat as chat_emulation
from gateway.path.chat_request import normalize_chat
from gateway.path.routing import Router
from providers import REGISTRY
from providers.base import Endpoint, map_params
from providers.llamacpp import LlamaCppAdapter
from providers.ollama import OllamaAdapter
from providers.openai import OpenAIAdapter
from providers.tgi import TGIAdapter
from providers.together import TogetherAdapter
from providers.vllm import VLLM_NATIVE, VLLMAdapter
from tests.helpers.adapters import COMPLETION_FIELDS, NATIVE, build, request
from wire.chat import decode_chat
from wire.errors import InvalidRequestError, UnsupportedParamError
from wire.schema import MAX_LOGPROBS, MAX_STOPS

SIX_STOPS = ["\nclass", "\ndef", "\n#", "\nif", "\nprint", "\n```"]


def endpoint(provider: str, base_url: str = "http://127.0.0.1:8000/v1") -> Endpoint:
    return Endpoint(provider=provider, model="m", base_url=base_url)


# --- stop sequences ----------------------------------------------------------------------------------------


def test_stop_count_per_kind() -> None:
    assert {kind: cls.max_stop for kind, cls in REGISTRY.items()} == {
        # OpenAI's "up to 4" (Azure, Fireworks' seed 001, SGP's seed 003; Together and PAIS document none)
        "openai": 4,
        "azure": 4,
        "fireworks": 4,
        "together": 4,
        "pais": 4,
        "sgp": 4,
        # api-docs.deepseek.com "Up to 16 sequences"
        "deepseek": 16,
        # vLLM, llama.cpp and Ollama take any number; Anthropic, Mistral and Bedrock document no small limit
        "vllm": None,
        "sglang": None,
        "llamacpp": None,
        "ollama": None,
        "anthropic": None,
        "mistral": None,
        "bedrock": None,
        "fake": None,
        # TGI's --max-stop-sequences default; Gemini's stopSequences and Cohere's stop_sequences: up to 5
        "tgi": 4,
        "gemini": 5,
        "cohere": 5,
    }


def test_six_stops_decode_and_reach_vllm_unchanged() -> None:
    req = request(stop=SIX_STOPS)
    assert emulation.plan(VLLMAdapter(), req, "local", retries=0) is None
    _, body, _ = build(VLLMAdapter(), req, endpoint("local"))
    assert body["stop"] == SIX_STOPS


@pytest.mark.parametrize("field", ["stop", "stop_sequences"])
def test_openai_is_sent_its_four_and_the_gateway_enforces_all_six(field: str) -> None:
    req = request(**dict[str, Any]({field: SIX_STOPS}))
    em = emulation.plan(OpenAIAdapter(), req, "openai", retries=0)
    assert em is not None
    assert (em.upstream_stop, em.stops, em.include_stop) == (SIX_STOPS[:4], SIX_STOPS, False)
    (sub,) = emulation.sub_requests(em, req)
    _, body, _ = build(OpenAIAdapter(), sub, endpoint("openai"))
    assert body["stop"] == SIX_STOPS[:4]


def test_four_stops_to_openai_need_no_gateway_enforcement() -> None:
    assert emulation.plan(OpenAIAdapter(), request(stop=SIX_STOPS[:4]), "openai", retries=0) is None


def test_a_natively_echoed_prompt_is_echoed_by_the_gateway_when_it_enforces_stops() -> None:
    # Otherwise the stop scan would cut inside the echoed prompt ("\nif" is a stop).
    req = request(prompt="def f():\nif x", echo=True, stop=SIX_STOPS)
    em = emulation.plan(OpenAIAdapter(), req, "openai", retries=0)
    assert em is not None and em.echo
    (sub,) = emulation.sub_requests(em, req)
    assert (sub.echo, sub.stop) == (None, SIX_STOPS[:4])
    assert emulation.plan(OpenAIAdapter(), request(echo=True, stop=SIX_STOPS[:4]), "openai", retries=0) is None
    for fields in ({"logprobs": 1}, {"prompt": [1, 2, 3]}, {"prompt": ["a", "b"]}):
        with pytest.raises(InvalidRequestError) as info:
            emulation.plan(OpenAIAdapter(), request(echo=True, stop=SIX_STOPS, **fields), "openai", retries=0)
        assert (info.value.status, info.value.param) == (400, "echo")


def test_decode_bounds_are_absolute_not_openais() -> None:
    assert (MAX_STOPS, MAX_LOGPROBS) == (64, 100)
    assert request(stop=[str(i) for i in range(MAX_STOPS)]).stop == [str(i) for i in range(MAX_STOPS)]


# --- logprobs ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fields", [{"logprobs": 10}, {"logprobs": True, "top_logprobs": 10}])
def test_ten_logprobs_pass_vllm_and_are_refused_by_openai(fields: dict[str, Any]) -> None:
    req = request(**fields)
    _, body, _ = build(VLLMAdapter(), req, endpoint("local"))
    assert body["logprobs"] == 10
    with pytest.raises(UnsupportedParamError) as info:
        OpenAIAdapter().check(req, "openai")
    err = info.value
    assert (err.status, err.param, err.code) == (400, "logprobs", "unsupported_parameter")
    assert err.message == "Provider 'openai' returns at most 5 logprobs, got 10"


def test_configured_max_logprobs_is_the_providers_bound() -> None:
    small = VLLMAdapter().configure(8)
    small.check(request(logprobs=8), "vl")
    with pytest.raises(UnsupportedParamError) as info:
        small.check(request(logprobs=10), "vl")
    assert (info.value.param, info.value.message) == ("logprobs", "Provider 'vl' returns at most 8 logprobs, got 10")
    # Per provider instance: the kind's default is untouched for every other provider of the kind.
    assert (VLLMAdapter.max_logprobs, VLLMAdapter().max_logprobs, VLLMAdapter().configure(None).max_logprobs) == (
        20,
        20,
        20,
    )
    large = VLLMAdapter().configure(50)
    large.check(request(logprobs=50), "vl")


# --- native fields -----------------------------------------------------------------------------------------


def test_the_kit_covers_every_native_field() -> None:
    # The native fields follow the seeds' fields in the request; the kit must sample all of them.
    assert tuple(NATIVE) == COMPLETION_FIELDS[COMPLETION_FIELDS.index("min_p") :]


def test_every_native_field_is_taken_by_some_provider() -> None:
    # On completions, or on chat (`chat_template_kwargs` is a chat template's).
    taken = {f for cls in REGISTRY.values() for f in (*cls.params, *(cls.chat_params or {}))}
    assert set(NATIVE) <= taken


def test_vllm_takes_its_own_fields_as_they_are() -> None:
    fields = {f: NATIVE[f] for f in VLLM_NATIVE}
    _, body, dropped = build(VLLMAdapter(), request(**fields, top_k=40), endpoint("local"))
    assert dropped == []
    assert body == {"model": "m", "prompt": "Say this is a test", **fields, "top_k": 40}


def test_tgi_takes_its_own_fields_in_parameters() -> None:
    req = request(repetition_penalty=1.2, typical_p=0.5, truncate_prompt_tokens=1000, watermark=True, top_k=10)
    _, body, _ = build(TGIAdapter(), req, endpoint("hf", "http://tgi:8080"))
    assert body["parameters"] == {
        "repetition_penalty": 1.2,
        "typical_p": 0.5,
        "truncate": 1000,
        "watermark": True,
        "top_k": 10,
        "do_sample": True,
        "details": True,
        "return_full_text": False,
        "decoder_input_details": True,
    }


def test_tgi_drops_typical_p_when_greedy_or_filtering_nothing() -> None:
    # TGI takes typical_p only inside (0, 1), and any sampling knob turns sampling on.
    greedy = build(TGIAdapter(), request(temperature=0, typical_p=0.5), endpoint("hf", "http://tgi:8080"))[1]
    assert "typical_p" not in greedy["parameters"] and greedy["parameters"]["do_sample"] is False
    one = build(TGIAdapter(), request(typical_p=1.0), endpoint("hf", "http://tgi:8080"))[1]
    assert "typical_p" not in one["parameters"]


def test_tgi_refuses_vllms_minus_one_truncation() -> None:
    with pytest.raises(InvalidRequestError) as info:
        build(TGIAdapter(), request(truncate_prompt_tokens=-1), endpoint("hf", "http://tgi:8080"))
    assert (info.value.status, info.value.param) == (400, "truncate_prompt_tokens")


def test_ollama_takes_its_own_fields_in_options() -> None:
    req = request(repetition_penalty=1.1, min_p=0.05, typical_p=0.7, repeat_last_n=32, num_ctx=8192, top_k=40)
    _, body, _ = build(OllamaAdapter(), req, endpoint("ol", "http://127.0.0.1:11434"))
    assert body["options"] == {
        "repeat_penalty": 1.1,
        "min_p": 0.05,
        "typical_p": 0.7,
        "repeat_last_n": 32,
        "num_ctx": 8192,
        "top_k": 40,
    }


def test_llamacpp_takes_its_own_fields_under_its_names() -> None:
    fields: dict[str, Any] = {
        "repetition_penalty": 1.1,
        "min_p": 0.05,
        "typical_p": 0.7,
        "repeat_last_n": 32,
        "ignore_eos": True,
        "mirostat": 2,
        "mirostat_tau": 5.0,
        "mirostat_eta": 0.1,
    }
    _, body, _ = build(LlamaCppAdapter(), request(**fields), endpoint("llama", "http://127.0.0.1:8080"))
    expected = {("repeat_penalty" if k == "repetition_penalty" else k): v for k, v in fields.items()}
    assert {k: body[k] for k in expected} == expected
    assert "repetition_penalty" not in body


def test_together_takes_repetition_penalty_and_min_p() -> None:
    req = request(repetition_penalty=1.1, min_p=0.05)
    _, body, _ = build(TogetherAdapter(), req, endpoint("together", "https://api.together.xyz/v1"))
    assert (body["repetition_penalty"], body["min_p"]) == (1.1, 0.05)


@pytest.mark.parametrize("field", list(NATIVE))
def test_openai_refuses_each_native_field_by_name(field: str) -> None:
    with pytest.raises(UnsupportedParamError) as info:
        build(OpenAIAdapter(), request(**{field: NATIVE[field]}), endpoint("openai"))
    err = info.value
    assert (err.status, err.param, err.code) == (400, field, "unsupported_parameter")
    assert err.message == f"Parameter '{field}' is not supported by provider 'openai'"


def test_drop_policy_drops_native_fields_and_lists_them() -> None:
    req = request(repetition_penalty=1.2, min_p=0.1, top_k=5, temperature=0.5)
    body, dropped = map_params(req, OpenAIAdapter.params, "openai", drop_unsupported=True)
    assert body == {"temperature": 0.5}
    assert dropped == ["top_k", "min_p", "repetition_penalty"]


@pytest.mark.parametrize(
    "field,value",
    [
        ("repetition_penalty", 0),
        ("min_p", 1.5),
        ("typical_p", -0.1),
        ("stop_token_ids", [-1]),
        ("allowed_token_ids", ["a"]),
        ("mirostat", 3),
        ("num_ctx", 0),
        ("truncate_prompt_tokens", -2),
        ("ignore_eos", "yes"),
    ],
)
def test_native_fields_are_typed(field: str, value: Any) -> None:
    with pytest.raises(msgspec.ValidationError) as info:
        request(**{field: value})
    assert f"`$.{field}" in str(info.value)


# --- config ------------------------------------------------------------------------------------------------


def test_max_logprobs_in_the_config_is_bounded_and_reaches_the_route() -> None:
    text = "providers:\n  local: {kind: vllm, base_url: 'http://127.0.0.1:8000/v1', max_logprobs: %s}\n"
    route = Router(parse_config(text % 8)).resolve("local/opt")
    assert route.adapter.max_logprobs == 8
    assert Router(parse_config(text % "null")).resolve("local/opt").adapter.max_logprobs == 20
    with pytest.raises(ConfigError) as info:
        parse_config(text % (MAX_LOGPROBS + 1))
    assert "providers.local.max_logprobs" in str(info.value)


def test_max_n_turns_on_llama_servers_n_and_bounds_every_kind_that_takes_n() -> None:
    text = "providers:\n  p: {kind: %s, base_url: 'http://127.0.0.1:8000', max_n: %s}\n"
    llama = Router(parse_config(text % ("llamacpp", 4))).resolve("p/m").adapter
    assert llama.max_n == 4 and not llama.params["n"].emulated
    plain = Router(parse_config(text % ("llamacpp", "null"))).resolve("p/m").adapter
    assert plain.params["n"].emulated
    # n up to the bound in one call, above it one call per choice; a kind without n fans out already.
    vllm = Router(parse_config(text % ("vllm", 2))).resolve("p/m").adapter
    assert emulation.plan(vllm, request(n=2), "p", 0) is None
    fanned = emulation.plan(vllm, request(n=3), "p", 0)
    assert fanned is not None and (fanned.fan_n, fanned.n) == (3, 3)
    assert emulation.plan(llama, request(n=4), "p", 0) is None
    assert emulation.plan(llama, request(n=5), "p", 0) is not None
    # best_of's candidates in one call where they fit in a configured max_n, ranked by the gateway all the same.
    for adapter, best_of, fan in ((llama, 4, 1), (llama, 5, 5), (plain, 3, 3)):
        candidates = request(best_of=best_of, logprobs=1)
        em = emulation.plan(adapter, candidates, "p", 0)
        assert em is not None and (em.fan_n, em.best_of) == (fan, best_of)
        assert [s.n for s in emulation.sub_requests(em, candidates)] == ([best_of] if fan == 1 else [None] * fan)
    # Chat the same, where the kind's chat route takes n; llama-server's chat is fanned out whatever max_n says.
    chat = {"model": "p/m", "messages": [{"role": "user", "content": "hi"}]}
    for adapter, n, chat_fan in ((vllm, 2, None), (vllm, 3, 3), (llama, 2, 2)):
        asked = normalize_chat(decode_chat(msgspec.json.encode({**chat, "n": n})))
        assert adapter.chat_params is not None
        chat_em = chat_emulation.plan(adapter, adapter.chat_params, asked, "p", CapsConfig())
        assert (chat_em.fan_n if chat_em is not None else None) == chat_fan, (adapter.kind, n)
    for kind in ("tgi", "ollama"):  # one choice per call, and no way to ask for more
        with pytest.raises(ConfigError) as info:
            parse_config(text % (kind, 2))
        assert "providers.p.max_n: kind" in str(info.value)
    with pytest.raises(ConfigError) as info:
        parse_config(text % ("vllm", 0))
    assert "providers.p.max_n" in str(info.value)
