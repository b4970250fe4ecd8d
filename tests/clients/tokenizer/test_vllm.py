"""vLLM's tokenizer routes in the client's own dialect, through the gateway to a loopback vLLM."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.clients.tokenizer.upstreams import BASE, BOS, FULL_KEY, MODEL, SERVED, VLLM_KEY, error_envelope
from tests.helpers.accesslog import listening
from tests.helpers.servers import GatewayThread
from tests.helpers.upstreams import Upstream, reply
from tests.helpers.waiting import wait_until

# -- vLLM: the client's own dialect -------------------------------------------------------------------------


def test_tokenize_reaches_vllm_at_its_root_with_its_own_model_name(api: httpx.Client, upstream: Upstream) -> None:
    resp = api.post(f"{BASE}/tokenize", json={"prompt": "Hi", "add_special_tokens": False, "return_token_strs": True})
    assert resp.status_code == 200, resp.text
    assert resp.json() == {"count": 2, "max_model_len": 2048, "tokens": [72, 105], "token_strs": ["H", "i"]}
    assert resp.headers["x-gateway-provider"] == "vl"
    assert resp.headers["x-gateway-model"] == MODEL
    sent = upstream.only()
    assert (sent.method, sent.path) == ("POST", "/vl/tokenize")  # base_url .../vl/v1 minus its /v1
    assert sent.json() == {"model": SERVED, "prompt": "Hi", "add_special_tokens": False, "return_token_strs": True}
    # The client's key is the gateway's business; vl has no upstream key, so nothing is sent.
    assert "authorization" not in sent.headers


def test_tokenize_defaults_and_token_strs_null_as_vllm_answers(api: httpx.Client, upstream: Upstream) -> None:
    resp = api.post(f"{BASE}/tokenize", json={"prompt": "a"})
    assert resp.status_code == 200, resp.text
    assert resp.json() == {"count": 2, "max_model_len": 2048, "tokens": [BOS, 97], "token_strs": None}
    assert upstream.only().json() == {"model": SERVED, "prompt": "a", "add_special_tokens": True}


@pytest.mark.parametrize("strs", [["H"], ["H", "i", "!"]])
def test_token_strings_of_another_count_than_the_tokens_are_an_invalid_answer(
    api: httpx.Client, upstream: Upstream, strs: list[str]
) -> None:
    answer = {"count": 2, "max_model_len": 2048, "tokens": [72, 105], "token_strs": strs}
    upstream.handler = reply(json.dumps(answer).encode())
    resp = api.post(f"{BASE}/tokenize", json={"prompt": "Hi", "add_special_tokens": False, "return_token_strs": True})
    assert resp.status_code == 502, resp.text
    assert resp.json()["error"]["code"] == "invalid_upstream_response"


def test_detokenize_and_tokenizer_info_under_the_model_path(api: httpx.Client, upstream: Upstream) -> None:
    resp = api.post(f"{BASE}/detokenize", json={"tokens": [BOS, 72, 105]})
    assert resp.status_code == 200, resp.text
    assert resp.json() == {"prompt": "Hi"}
    assert upstream.received[0].json() == {"model": SERVED, "tokens": [BOS, 72, 105]}
    info = api.get(f"{BASE}/tokenizer_info")
    assert info.status_code == 200, info.text
    assert info.json()["eos_token"] == "</s>"
    assert [(r.method, r.path) for r in upstream.received] == [
        ("POST", "/vl/detokenize"),
        ("GET", "/vl/tokenizer_info"),
    ]


def test_bare_routes_take_the_body_model_then_the_configured_default(api: httpx.Client, upstream: Upstream) -> None:
    named = api.post("/tokenize", json={"model": MODEL, "prompt": "x"})
    assert named.status_code == 200, named.text
    # No model at all (lm-eval's remote tokenizer sends none): tokenizer.default_model, an alias of vl.
    default = api.post("/tokenize", json={"prompt": "x", "add_special_tokens": False})
    assert default.status_code == 200, default.text
    assert default.json()["tokens"] == [120]
    assert api.post("/detokenize", json={"tokens": [120]}).json() == {"prompt": "x"}
    assert api.get("/tokenizer_info").status_code == 200
    assert [r.path for r in upstream.received] == ["/vl/tokenize"] * 2 + ["/vl/detokenize", "/vl/tokenizer_info"]
    assert all(r.json()["model"] == SERVED for r in upstream.received if r.method == "POST")


def test_an_alias_in_the_path_tokenizes_with_its_first_target(api: httpx.Client, upstream: Upstream) -> None:
    resp = api.post("/m/evalmodel/tokenize", json={"prompt": "x", "add_special_tokens": False})
    assert resp.status_code == 200, resp.text
    assert resp.headers["x-gateway-model"] == MODEL
    assert upstream.only().json()["model"] == SERVED


def test_a_provider_whose_key_variable_is_unset_fails_fast(api: httpx.Client, upstream: Upstream) -> None:
    message = error_envelope(api.post("/m/vlgone/m/tokenize", json={"prompt": "x"}), 400, "provider_unavailable")
    assert "T_UNSET_VLLM_KEY" in message
    assert upstream.received == []


def test_lm_eval_remote_tokenizer_sequence(gateway: GatewayThread, upstream: Upstream) -> None:
    """What lm-eval's `check_remote_tokenizer_support` and `RemoteTokenizer` send (lm_eval/utils.py), from a
    `base_url` with `/v1/completions` cut off, with `auth_token` as a Bearer header and no model."""
    base_url = f"{gateway.url}{BASE}/v1/completions"
    server_base = base_url.replace("/v1/completions", "").rstrip("/")
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {FULL_KEY}"}
    with httpx.Client(trust_env=False, timeout=15, headers=headers) as client:
        info = client.get(f"{server_base}/tokenizer_info")
        assert info.status_code == 200 and "eos_token" in info.json(), info.text
        tokens = client.post(f"{server_base}/tokenize", json={"prompt": "test", "add_special_tokens": False})
        assert tokens.status_code == 200 and isinstance(tokens.json()["tokens"], list), tokens.text
        eos = client.post(
            f"{server_base}/tokenize", json={"prompt": info.json()["eos_token"], "add_special_tokens": False}
        )
        assert eos.json()["tokens"][0] == ord("<")
        text = client.post(f"{server_base}/detokenize", json={"tokens": tokens.json()["tokens"]})
        assert text.json() == {"prompt": "test"}


def test_vllm_without_tokenizer_info_is_a_404_that_says_how_to_enable_it(api: httpx.Client) -> None:
    message = error_envelope(api.get("/m/vlold/m1/tokenizer_info"), 404, "tokenizer_not_available")
    assert "'vlold'" in message and "--enable-tokenizer-info-endpoint" in message


def test_an_unknown_upstream_model_is_a_client_error_not_a_gateway_failure(api: httpx.Client) -> None:
    resp = api.post("/m/vl/not-served/tokenize", json={"prompt": "x"})
    assert resp.status_code in (400, 404), resp.text
    assert "does not exist" in resp.json()["error"]["message"]


def test_tokenizer_url_overrides_the_derived_root(api: httpx.Client, upstream: Upstream) -> None:
    resp = api.post(f"/m/moved/{SERVED}/tokenize", json={"prompt": "x"})
    assert resp.status_code == 200, resp.text
    assert upstream.only().path == "/elsewhere/tokenize"


def test_the_upstream_gets_the_providers_key_and_headers_never_the_clients(
    api: httpx.Client, upstream: Upstream
) -> None:
    resp = api.post(f"/m/vlkey/{SERVED}/tokenize", json={"prompt": "x"}, headers={"x-tenant": "client-says"})
    assert resp.status_code == 200, resp.text
    sent = upstream.only().headers
    assert sent["authorization"] == f"Bearer {VLLM_KEY}"
    assert sent["x-tenant"] == "eval"
    assert FULL_KEY not in str(sent)


def test_upstream_error_text_is_scrubbed(api: httpx.Client, upstream: Upstream) -> None:
    resp = api.post(f"/m/vlkey/{SERVED}/tokenize", json={"prompt": "leak"})
    assert resp.status_code == 400, resp.text
    assert VLLM_KEY not in resp.text
    assert "[redacted]" in resp.json()["error"]["message"]


def test_a_conversation_is_tokenized_by_vllms_own_template(api: httpx.Client, upstream: Upstream) -> None:
    # vLLM's chat form of /tokenize, for RL rollouts that count a chat prompt as the served model renders it.
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    resp = api.post(f"{BASE}/tokenize", json={"messages": messages})
    assert resp.status_code == 200, resp.text
    rendered = [ord(c) for c in "<system>Be brief.<user>Hi<assistant>"]
    assert resp.json() == {"count": len(rendered), "max_model_len": 2048, "tokens": rendered, "token_strs": None}
    # vLLM's defaults for the form, the model rewritten; nothing left out that vLLM reads.
    assert upstream.only().json() == {
        "model": SERVED,
        "messages": messages,
        "add_generation_prompt": True,
        "continue_final_message": False,
        "add_special_tokens": False,
    }
    upstream.received.clear()
    prefill = [*messages, {"role": "assistant", "content": "Hel"}]
    body = {
        "messages": prefill,
        "add_generation_prompt": False,
        "continue_final_message": True,
        "chat_template_kwargs": {"enable_thinking": False},
        "tools": [{"type": "function", "function": {"name": "f"}}],
    }
    resp = api.post(f"{BASE}/tokenize", json=body)
    assert resp.status_code == 200, resp.text
    assert resp.json()["tokens"] == [ord(c) for c in "<system>Be brief.<user>Hi<assistant>Hel"]
    assert upstream.only().json() == {"model": SERVED, **body, "add_special_tokens": False}


def test_a_conversations_bad_fields_are_400s_naming_them(api: httpx.Client, upstream: Upstream) -> None:
    chat = {"messages": [{"role": "user", "content": "Hi"}]}
    for body, code, param in (
        ({"prompt": "x", **chat}, "invalid_value", "prompt"),
        ({}, "missing_required_parameter", "prompt"),
        ({"messages": []}, "invalid_value", "messages"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "invalid_value", "messages.role"),
        ({**chat, "tools": [{"type": "function"}]}, "invalid_value", "tools"),
        ({"prompt": "x", "add_generation_prompt": False}, "invalid_value", "add_generation_prompt"),
        ({**chat, "continue_final_message": True}, "invalid_value", "continue_final_message"),
        ({**chat, "chat_template": "{{ x }}"}, "unknown_parameter", "chat_template"),
        (
            {**chat, "chat_template_kwargs": {"chat_template": "{{ x }}"}},
            "invalid_value",
            "chat_template_kwargs.chat_template",
        ),
    ):
        error_envelope(api.post(f"{BASE}/tokenize", json=body), 400, code, param=param)
    assert upstream.received == []


def test_each_call_is_logged_under_its_own_route(api: httpx.Client, upstream: Upstream) -> None:
    # The access log is the one record of a tokenizer call: its line names the route, never `completions`.
    with listening() as access:
        assert api.post(f"{BASE}/tokenize", json={"prompt": "x"}).status_code == 200
        assert api.post(f"{BASE}/detokenize", json={"tokens": [120]}).status_code == 200
        assert api.get(f"{BASE}/tokenizer_info").status_code == 200
        wait_until(lambda: len(access.lines) >= 3)
    assert [(line["dialect"], line["endpoint"], line["model"]) for line in access.lines] == [
        ("tokenizer", "tokenize", MODEL),
        ("tokenizer", "detokenize", MODEL),
        ("tokenizer", "tokenizer_info", MODEL),
    ]


@pytest.mark.parametrize(
    ("name_or_path", "kept"),
    [
        pytest.param("/srv/models/Llama-3.1-8B-Instruct", False, id="absolute"),
        pytest.param("./weights/llama", False, id="dot-relative"),
        pytest.param("~/models/llama", False, id="home"),
        pytest.param("C:\\models\\llama", False, id="windows"),
        # A relative directory reads just like a Hub id; so does another model's id than the one asked for.
        pytest.param("models/llama", False, id="relative-like-a-hub-id"),
        pytest.param("meta-llama/Llama-3.1-8B-Instruct", False, id="another-hub-id"),
        pytest.param(SERVED, True, id="the-models-own-name"),
    ],
)
def test_tokenizer_info_keeps_the_tokenizer_and_drops_the_servers_paths_and_settings(
    api: httpx.Client, upstream: Upstream, name_or_path: str, kept: bool
) -> None:
    # What vLLM's `TokenizerInfo._get_tokenizer_config` answers for a Hugging Face tokenizer read from a local
    # directory: its init kwargs (vocab_file and merges_file already dropped by vLLM), where it was read from and
    # the `from_pretrained` arguments it was loaded with among them, then tokenizer_class and the chat template.
    tokenizer = {
        "add_bos_token": True,
        "bos_token": "<|begin_of_text|>",
        "eos_token": "<|eot_id|>",
        "pad_token": None,
        "sep_token": "/",
        "model_max_length": 131072,
        "added_tokens_decoder": {"128000": {"content": "<|begin_of_text|>", "special": True}},
        "chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}",
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    server = {
        "name_or_path": name_or_path,
        "tokenizer_file": "/srv/models/Llama-3.1-8B-Instruct/tokenizer.json",
        "special_tokens_map_file": "/srv/models/Llama-3.1-8B-Instruct/special_tokens_map.json",
        "cache_dir": "/srv/hf-cache",
        "trust_remote_code": False,
        "revision": None,
        "_commit_hash": None,
        "_from_auto": True,
        "local_weights": "/srv/models/Llama-3.1-8B-Instruct",
    }
    upstream.handler = reply(json.dumps({**tokenizer, **server}).encode())
    info = api.get(f"{BASE}/tokenizer_info")
    assert info.status_code == 200, info.text
    expected = {**tokenizer, "name_or_path": name_or_path} if kept else tokenizer
    assert info.json() == expected
    assert "/srv" not in info.text
