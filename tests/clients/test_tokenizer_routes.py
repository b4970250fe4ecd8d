"""vLLM's tokenizer routes and the model-scoped base path, over real sockets.

The gateway is `create_app` under uvicorn (tests/helpers/servers.py). The upstreams are one loopback aiohttp
server speaking, under a path prefix each, vLLM's (`/vl`, `/vlold`, `/moved`), llama.cpp's (`/ll`) and
TGI's (`/tgi`) tokenizer routes. No recording of these routes exists (tests/fixtures, /work/shared/fixtures),
so their answers follow the servers' own source and docs, quoted where each is built below:
- vLLM `vllm/entrypoints/serve/tokenize/protocol.py` + `api_router.py`: TokenizeResponse {count,
  max_model_len, tokens, token_strs}, DetokenizeResponse {prompt}, tokenizer_info = the tokenizer's init
  kwargs + tokenizer_class (route absent unless `--enable-tokenizer-info-endpoint`: FastAPI's 404
  `{"detail":"Not Found"}`); an unknown model is a 404 ErrorResponse (`_check_model`).
- llama.cpp `tools/server/README.md`: /tokenize {content, add_special, with_pieces} -> {tokens: [id] |
  [{id, piece: str | [byte]}]}; /detokenize {tokens} -> {content}; /props default_generation_settings.n_ctx.
- TGI `router/src/server.rs`: /tokenize {inputs} -> [{id, text, start, stop}]; /info max_total_tokens.
The completion answer is the real vLLM recording tests/fixtures/vllm/completion_opt125m.json.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from aiohttp import web

from gateway.config import ConfigError, parse_config
from gateway.edge import tokenizer_routes
from tests.helpers.clients import openai_client
from tests.helpers.recordings import fixture_bytes
from tests.helpers.servers import GatewayThread, serve_config
from tests.helpers.upstreams import Received, Upstream

FULL_KEY = "gk-tok-full-5d1e"
NARROW_KEY = "gk-tok-narrow-77a0"
SLOW_KEY = "gk-tok-slow-0c9b"
VLLM_KEY = "sk-tok-vllm-secret-4242"
SERVED = "facebook/opt-125m"  # the vLLM recording's model, the name the loopback vLLM serves
MODEL = f"vl/{SERVED}"
BASE = f"/m/{MODEL}"

CONFIG = """
server: {{host: 127.0.0.1, port: 0}}
retries: {{attempts: 1}}
keys:
  - {{name: full, key: "${{T_FULL}}"}}
  - {{name: narrow, key: "${{T_NARROW}}", models: ["ll/**"]}}
  - {{name: slow, key: "${{T_SLOW}}", limits: {{rpm: 1}}}}
providers:
  vl: {{kind: vllm, base_url: {u}/vl/v1}}
  vlold: {{kind: vllm, base_url: {u}/vlold/v1}}
  moved: {{kind: vllm, base_url: {u}/moved/v1, tokenizer_url: {u}/elsewhere}}
  ll: {{kind: llamacpp, base_url: {u}/ll}}
  lv: {{kind: vllm, base_url: {u}/ll/v1}}
  tgi: {{kind: tgi, base_url: {u}/tgi}}
  oa: {{kind: openai, api_key: sk-tok-upstream-secret, base_url: {u}/oa/v1}}
  vlgone: {{kind: vllm, api_key: "${{T_UNSET_VLLM_KEY}}", base_url: {u}/vlgone/v1}}
  vlkey: {{kind: vllm, api_key: {vllm_key}, base_url: {u}/vlkey/v1, headers: {{x-tenant: eval}}}}
  demo: {{kind: fake}}
models:
  - name: evalmodel
    targets: [{{model: {model}}}]
tokenizer: {{default_model: evalmodel}}
"""
ENV = {"T_FULL": FULL_KEY, "T_NARROW": NARROW_KEY, "T_SLOW": SLOW_KEY}
AUTH = {"authorization": f"Bearer {FULL_KEY}"}

# A toy tokenizer for the loopback servers: one token per character, 1 = BOS.
BOS = 1


def _ids(text: str, special: bool) -> list[int]:
    return ([BOS] if special else []) + [ord(c) for c in text]


def _json(body: Any, status: int = 200) -> web.Response:
    return web.json_response(body, status=status)


async def _vllm(request: web.Request, rec: Received, served: str = SERVED) -> web.StreamResponse:
    tail = rec.path.split("/", 2)[2]  # the path after the provider's prefix
    if tail == "v1/completions":
        return web.Response(body=fixture_bytes("vllm/completion_opt125m.json"), content_type="application/json")
    if tail == "tokenizer_info":
        if rec.path.startswith("/vlold/"):
            return _json({"detail": "Not Found"}, 404)  # FastAPI: the route was not registered
        return _json({"tokenizer_class": "GPT2TokenizerFast", "eos_token": "</s>", "bos_token": "</s>"})
    body = rec.json()
    if body.get("model") not in (None, served):
        error = {"message": f"The model `{body['model']}` does not exist.", "type": "NotFoundError", "param": None}
        return _json({"error": {**error, "code": 404}}, 404)
    if tail == "tokenize":
        ids = _ids(body["prompt"], body.get("add_special_tokens", True))
        strs = [chr(i) if i != BOS else "</s>" for i in ids] if body.get("return_token_strs") else None
        return _json({"count": len(ids), "max_model_len": 2048, "tokens": ids, "token_strs": strs})
    if tail == "detokenize":
        return _json({"prompt": "".join(chr(i) for i in body["tokens"] if i != BOS)})
    return _json({"detail": "Not Found"}, 404)


async def _llamacpp(request: web.Request, rec: Received) -> web.StreamResponse:
    if rec.path == "/ll/props":
        props = {"bos_token": "<s>", "eos_token": "</s>", "chat_template": "{{ messages }}", "model_path": "m.gguf"}
        return _json({"default_generation_settings": {"n_ctx": 4096}, "total_slots": 1, **props})
    body = rec.json() if rec.method == "POST" else {}
    if rec.path == "/ll/tokenize":
        if "content" not in body:  # llama-server reads only `content`: vLLM's `prompt` tokenizes to nothing
            return _json({"tokens": []})
        ids = _ids(body["content"], body.get("add_special", False))
        if not body.get("with_pieces"):
            return _json({"tokens": ids})
        # A piece that is not valid UTF-8 comes as its bytes (the README's 'á' example).
        return _json({"tokens": [{"id": i, "piece": [195] if i == 225 else chr(i)} for i in ids]})
    if rec.path == "/ll/detokenize":
        return _json({"content": "".join(chr(i) for i in body["tokens"] if i != BOS)})
    # llama-server's answer to a path it does not serve (tools/server/server-http.cpp, set_error_handler).
    not_found = {"error": {"message": "File Not Found", "type": "not_found_error", "code": 404}}
    return web.Response(status=404, body=json.dumps(not_found, separators=(",", ":")), content_type="application/json")


async def _tgi(request: web.Request, rec: Received) -> web.StreamResponse:
    if rec.path == "/tgi/info":
        return _json({"model_id": "bigscience/bloom-560m", "max_input_tokens": 1024, "max_total_tokens": 2048})
    if rec.path == "/tgi/tokenize":
        text = rec.json()["inputs"]
        return _json([{"id": ord(c), "text": c, "start": i, "stop": i + 1} for i, c in enumerate(text)])
    return web.Response(status=404)


async def _keyed_vllm(request: web.Request, rec: Received) -> web.StreamResponse:
    # A server that quotes the credential it refuses, as many do (docs/security.upstream.md).
    if rec.json().get("prompt") == "leak":
        message = f"Token rejected: {rec.headers.get('authorization')}"
        return _json({"error": {"message": message, "type": "BadRequestError", "param": None, "code": 400}}, 400)
    return await _vllm(request, rec)


async def _dispatch(request: web.Request, rec: Received) -> web.StreamResponse:
    prefix = rec.path.split("/", 2)[1]
    if prefix == "vlkey":
        return await _keyed_vllm(request, rec)
    if prefix in ("vl", "vlold"):
        return await _vllm(request, rec)
    if prefix in ("moved", "elsewhere"):
        return await _vllm(request, rec)
    if prefix == "ll":
        return await _llamacpp(request, rec)
    if prefix == "tgi":
        return await _tgi(request, rec)
    return web.Response(status=599, text=f"unexpected upstream call {rec.path}")


@pytest.fixture
def upstream(upstream_server: Upstream) -> Iterator[Upstream]:
    upstream_server.reset()
    upstream_server.handler = _dispatch
    yield upstream_server
    upstream_server.reset()


@pytest.fixture(scope="module")
def gateway(upstream_server: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayThread]:
    with serve_config(
        tmp_path_factory.mktemp("tokenizer"), CONFIG.format(u=upstream_server.url, model=MODEL, vllm_key=VLLM_KEY), ENV
    ) as gw:
        yield gw


@pytest.fixture
def api(gateway: GatewayThread, upstream: Upstream) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gateway.url, trust_env=False, timeout=15, headers=AUTH) as client:
        yield client


def _error(resp: httpx.Response, status: int, code: str | None, param: str | None = "model") -> str:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["code"] == code, err
    assert err["param"] == param, err
    message: str = err["message"]
    return message


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
    message = _error(api.post("/m/vlgone/m/tokenize", json={"prompt": "x"}), 400, "provider_unavailable")
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
    message = _error(api.get("/m/vlold/m1/tokenizer_info"), 404, "tokenizer_not_available")
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


# -- llama.cpp and TGI: translated to and from vLLM's shapes ---------------------------------------------------


def test_llamacpp_tokenize_is_translated_and_its_context_asked_once(api: httpx.Client, upstream: Upstream) -> None:
    body = {"prompt": "h\u00e1", "add_special_tokens": True, "return_token_strs": True}
    resp = api.post("/m/ll/tiny/tokenize", json=body)
    assert resp.status_code == 200, resp.text
    assert resp.json() == {
        "count": 3,
        "max_model_len": 4096,
        "tokens": [BOS, 104, 225],
        "token_strs": ["\x01", "h", "<0xC3>"],
    }
    tokenize, props = upstream.received
    assert tokenize.path == "/ll/tokenize"
    assert tokenize.json() == {"model": "tiny", "content": "h\u00e1", "add_special": True, "with_pieces": True}
    assert (props.method, props.path) == ("GET", "/ll/props")
    again = api.post("/m/ll/tiny/tokenize", json={"prompt": "h"})
    assert again.json() == {"count": 2, "max_model_len": 4096, "tokens": [BOS, 104], "token_strs": None}
    assert [r.path for r in upstream.received[2:]] == ["/ll/tokenize"]  # the context size is remembered


def test_llamacpp_detokenize_content_becomes_prompt(api: httpx.Client, upstream: Upstream) -> None:
    resp = api.post("/m/ll/tiny/detokenize", json={"tokens": [104, 105]})
    assert resp.status_code == 200, resp.text
    assert resp.json() == {"prompt": "hi"}
    assert upstream.only().json() == {"model": "tiny", "tokens": [104, 105]}


def test_tgi_tokenize_is_translated(api: httpx.Client, upstream: Upstream) -> None:
    resp = api.post("/m/tgi/bloom/tokenize", json={"prompt": "ok", "return_token_strs": True})
    assert resp.status_code == 200, resp.text
    assert resp.json() == {"count": 2, "max_model_len": 2048, "tokens": [111, 107], "token_strs": ["o", "k"]}
    assert upstream.received[0].json() == {"inputs": "ok"}
    assert [r.path for r in upstream.received] == ["/tgi/tokenize", "/tgi/info"]


def test_tgi_cannot_leave_out_special_tokens_and_has_no_detokenize(api: httpx.Client, upstream: Upstream) -> None:
    message = _error(
        api.post("/m/tgi/bloom/tokenize", json={"prompt": "ok", "add_special_tokens": False}),
        400,
        "unsupported_parameter",
        param="add_special_tokens",
    )
    assert "'tgi'" in message
    message = _error(api.post("/m/tgi/bloom/detokenize", json={"tokens": [1]}), 404, "tokenizer_not_available")
    assert "'tgi'" in message and "/detokenize" in message
    assert upstream.received == []


@pytest.mark.parametrize("model", ["oa/gpt-3.5-turbo-instruct", "demo/echo"])
@pytest.mark.parametrize("route", ["tokenize", "detokenize", "tokenizer_info"])
def test_providers_without_tokenizer_routes_answer_404(
    api: httpx.Client, upstream: Upstream, model: str, route: str
) -> None:
    body = {"tokenize": {"prompt": "x"}, "detokenize": {"tokens": [1]}}.get(route)
    resp = api.request("GET" if route == "tokenizer_info" else "POST", f"/m/{model}/{route}", json=body)
    message = _error(resp, 404, "tokenizer_not_available")
    assert f"'{model.partition('/')[0]}'" in message
    assert upstream.received == []


# -- auth, limits, hostile paths --------------------------------------------------------------------------------


def test_tokenizer_routes_need_a_key_and_respect_its_globs(gateway: GatewayThread, upstream: Upstream) -> None:
    with httpx.Client(base_url=gateway.url, trust_env=False, timeout=15) as bare:
        for path in ("/tokenize", f"{BASE}/tokenize"):
            _error(bare.post(path, json={"prompt": "x"}), 401, "missing_api_key", param=None)
        narrow = {"authorization": f"Bearer {NARROW_KEY}"}
        message = _error(bare.post(f"{BASE}/tokenize", json={"prompt": "x"}, headers=narrow), 403, "model_not_allowed")
        assert MODEL in message
        _error(
            bare.get("/tokenizer_info", headers=narrow), 403, "model_not_allowed"
        )  # the default is not allowed either
        ok = bare.post("/m/ll/tiny/detokenize", json={"tokens": [104]}, headers=narrow)
        assert ok.status_code == 200, ok.text
    assert [r.path for r in upstream.received] == ["/ll/detokenize"]


def test_tokenizer_requests_count_against_the_request_rate(gateway: GatewayThread, upstream: Upstream) -> None:
    with httpx.Client(base_url=gateway.url, trust_env=False, timeout=15) as bare:
        slow = {"authorization": f"Bearer {SLOW_KEY}"}
        first = bare.post(f"{BASE}/tokenize", json={"prompt": "x"}, headers=slow)
        assert first.status_code == 200, first.text
        assert first.headers["x-ratelimit-limit-requests"] == "1"
        second = bare.post(f"{BASE}/detokenize", json={"tokens": [1]}, headers=slow)
        _error(second, 429, "rate_limit_exceeded", param=None)
        assert int(second.headers["retry-after"]) > 0
    assert len(upstream.received) == 1


@pytest.mark.parametrize(
    "raw_path",
    [
        pytest.param("/m/vl/../oa/x/tokenize", id="dot-dot"),
        pytest.param("/m/vl/%2E%2E/oa/x/tokenize", id="encoded-dot-dot"),
        pytest.param("/m/vl%2F..%2Foa/tokenize", id="encoded-slash-dot-dot"),
        pytest.param("/m/vl/a%00b/tokenize", id="nul"),
        pytest.param("/m/vl/a%0D%0Ax-injected:%201/tokenize", id="crlf"),
        pytest.param("/m/vl/a%3Fb/tokenize", id="question-mark"),
        pytest.param("/m//tokenize", id="empty"),
        pytest.param("/m/vl/a%5Cb/v1/completions", id="backslash-completions"),
    ],
)
def test_a_hostile_model_in_the_path_is_a_400(gateway: GatewayThread, upstream: Upstream, raw_path: str) -> None:
    # http.client sends the path as written: no client-side dot-segment removal or re-encoding.
    conn = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=15)
    try:
        conn.request("POST", raw_path, body=b'{"prompt": "x"}', headers={**AUTH, "content-type": "application/json"})
        resp = conn.getresponse()
        status, body = resp.status, resp.read()
    finally:
        conn.close()
    assert status == 400, body
    err = httpx.Response(400, content=body).json()["error"]
    assert err["param"] == "model" and err["type"] == "invalid_request_error"
    assert upstream.received == []


def test_unknown_path_under_the_prefix_is_a_404_envelope(api: httpx.Client) -> None:
    _error(api.post(f"{BASE}/v1/embeddings", json={}), 404, "not_found", param=None)


def test_wrong_method_is_a_405(api: httpx.Client) -> None:
    assert api.get(f"{BASE}/tokenize").status_code == 405
    assert api.post("/tokenizer_info").status_code == 405


def test_bad_bodies_are_400s_naming_the_field(api: httpx.Client, upstream: Upstream) -> None:
    _error(api.post(f"{BASE}/tokenize", json={"prompt": 5}), 400, "invalid_value", param="prompt")
    _error(api.post(f"{BASE}/detokenize", json={"tokens": [-1]}), 400, "invalid_value", param="tokens")
    _error(api.post(f"{BASE}/tokenize", json={"prompt": "x", "max": 1}), 400, "unknown_parameter", param="max")
    _error(api.post(f"{BASE}/tokenize", json={"prompt": "x", "model": "vl/other"}), 400, "model_mismatch")
    assert upstream.received == []


# -- the model-scoped completion route, with the official SDK ---------------------------------------------------


def test_openai_client_completes_under_the_model_path(gateway: GatewayThread, upstream: Upstream) -> None:
    with openai_client(f"{gateway.url}{BASE}/v1", FULL_KEY) as client:
        done = client.completions.create(model=MODEL, prompt="San Francisco is a", max_tokens=5)
        assert done.choices[0].text
        with pytest.raises(openai.BadRequestError) as caught:
            client.completions.create(model="vl/someone-else", prompt="x", max_tokens=5)
        assert caught.value.body["param"] == "model"  # type: ignore[index]
    sent = upstream.only()
    assert sent.path == "/vl/v1/completions"
    assert sent.json()["model"] == SERVED


@pytest.mark.parametrize("body", [{"prompt": "x"}, {"prompt": "x", "model": None}], ids=["absent", "null"])
def test_a_completion_without_a_model_takes_the_one_in_the_path(
    api: httpx.Client, upstream: Upstream, body: dict[str, Any]
) -> None:
    resp = api.post(f"{BASE}/v1/completions", json=body)
    assert resp.status_code == 200, resp.text
    assert resp.json()["model"] == MODEL
    assert upstream.only().json()["model"] == SERVED


# -- config -------------------------------------------------------------------------------------------------------


def test_config_refuses_an_unroutable_default_and_a_bad_tokenizer_url() -> None:
    base = "providers: {vl: {kind: vllm, base_url: 'http://h/v1'}}\n"
    with pytest.raises(ConfigError, match=r"tokenizer\.default_model"):
        parse_config(base + "tokenizer: {default_model: nope/x}\n", env={})
    with pytest.raises(ConfigError, match=r"providers\.vl\.tokenizer_url"):
        parse_config("providers: {vl: {kind: vllm, base_url: 'http://h/v1', tokenizer_url: 'h/x'}}\n", env={})
    assert parse_config(base + "tokenizer: {default_model: vl/m}\n", env={}).config.tokenizer.default_model == "vl/m"


def test_llamacpp_tokenizer_info_is_built_from_props(api: httpx.Client, upstream: Upstream) -> None:
    info = api.get("/m/ll/tiny/tokenizer_info")
    assert info.status_code == 200, info.text
    assert info.json() == {
        "tokenizer_class": "llama.cpp",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "chat_template": "{{ messages }}",
        "model_max_length": 4096,
    }
    assert [(r.method, r.path) for r in upstream.received] == [("GET", "/ll/props")]


def test_tokenizer_info_takes_the_model_from_the_query(api: httpx.Client, upstream: Upstream) -> None:
    info = api.get("/tokenizer_info", params={"model": "ll/tiny"})
    assert info.status_code == 200, info.text
    assert info.json()["eos_token"] == "</s>"
    assert info.headers["x-gateway-provider"] == "ll"


def test_tokenizer_info_without_a_model_says_how_to_name_it_on_a_get() -> None:
    # This module's gateway has a default model; the words are the ones its refusal uses without one.
    assert "?model=" in str(tokenizer_routes._model_missing("tokenizer_info"))
    assert "send 'model'" in str(tokenizer_routes._model_missing("tokenize"))


def test_an_empty_tokenization_of_text_is_an_upstream_error(api: httpx.Client, upstream: Upstream) -> None:
    resp = api.post("/m/lv/tiny/tokenize", json={"prompt": "hello"})
    assert resp.status_code == 502, resp.text
    assert resp.json()["error"]["code"] == "invalid_upstream_response"
    assert upstream.only().json()["prompt"] == "hello"  # vLLM's field, which llama-server does not read


def test_llama_servers_404_for_a_route_it_lacks_is_tokenizer_not_available(api: httpx.Client) -> None:
    message = _error(api.get("/m/lv/tiny/tokenizer_info"), 404, "tokenizer_not_available")
    assert "'lv'" in message
