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
The completion answer is the real vLLM recording tests/fixtures/vllm/completion_opt125m.json."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from aiohttp import web

from tests.clients.tokenizer.upstreams import AUTH, BOS, FULL_KEY, MODEL, NARROW_KEY, SERVED, SLOW_KEY, VLLM_KEY
from tests.helpers.recordings import fixture_bytes
from tests.helpers.servers import GatewayThread, serve_config
from tests.helpers.upstreams import Received, Upstream

CONFIG = """
server: {{host: 127.0.0.1, port: 0}}
retries: {{attempts: 1}}
keys:
  - {{name: full, key: "${{T_FULL}}"}}
  - {{name: narrow, key: "${{T_NARROW}}", models: ["ll/**"]}}
  - {{name: slow, key: "${{T_SLOW}}", limits: {{rpm: 1}}}}
  - {{name: crew-1, key: gk-tok-crew-1, team: crew}}
  - {{name: crew-2, key: gk-tok-crew-2, team: crew}}
teams:
  crew: {{limits: {{rpm: 2}}}}
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
    if tail == "tokenize" and "messages" in body:
        # The chat form: a toy template, each turn as `<role>content`, then `<assistant>` for the answer to come.
        text = "".join(f"<{m['role']}>{m.get('content') or ''}" for m in body["messages"])
        text += "<assistant>" if body.get("add_generation_prompt", True) else ""
        ids = _ids(text, body.get("add_special_tokens", False))
        return _json({"count": len(ids), "max_model_len": 2048, "tokens": ids, "token_strs": None})
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
    if rec.path == "/tgi/chat_tokenize":
        # `get_chat_tokenize` (router/src/server.rs): a toy template, each turn as `<role>content`, then the
        # assistant's turn opened; the templated text's tokens as /tokenize answers them, beside that text.
        text = "".join(f"<{m['role']}>{m.get('content') or ''}" for m in rec.json()["messages"]) + "<assistant>"
        tokens = [{"id": ord(c), "text": c, "start": i, "stop": i + 1} for i, c in enumerate(text)]
        return _json({"tokenize_response": tokens, "templated_text": text})
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
