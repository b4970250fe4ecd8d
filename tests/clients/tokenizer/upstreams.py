"""The tokenizer tests' config, keys and loopback upstreams (vLLM, llama.cpp, TGI)."""

from __future__ import annotations

import httpx

FULL_KEY = "gk-tok-full-5d1e"
NARROW_KEY = "gk-tok-narrow-77a0"
SLOW_KEY = "gk-tok-slow-0c9b"
VLLM_KEY = "sk-tok-vllm-secret-4242"
SERVED = "facebook/opt-125m"  # the vLLM recording's model, the name the loopback vLLM serves
MODEL = f"vl/{SERVED}"
BASE = f"/m/{MODEL}"


AUTH = {"authorization": f"Bearer {FULL_KEY}"}

# A toy tokenizer for the loopback servers: one token per character, 1 = BOS.
BOS = 1


def error_envelope(resp: httpx.Response, status: int, code: str | None, param: str | None = "model") -> str:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["code"] == code, err
    assert err["param"] == param, err
    message: str = err["message"]
    return message
