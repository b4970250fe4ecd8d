"""The chat matrix's gateway config, kinds, cases and the loopback upstream speaking each kind's wire."""

from __future__ import annotations

from typing import Any

from tests.helpers.recordings import fixture_bytes, sse_events
from tests.helpers.upstreams import Handler, reply, reply_sse
from tests.native.test_bedrock_e2e import AKID, SECRET, reply_eventstream

OPENAI_FAMILY = (
    "openai",
    "azure",
    "fireworks",
    "together",
    "deepseek",
    "mistral",
    "vllm",
    "sglang",
    "llamacpp",
    "tgi",
    "ollama",
    "pais",
    "sgp",
)
NATIVE = ("anthropic", "gemini", "cohere", "bedrock")
KINDS = (*OPENAI_FAMILY, *NATIVE)

CONFIG = """
unsupported_params: error
retries: {{attempts: 1}}
providers:
  openai: {{kind: openai, api_key: k, base_url: {url}/openai/v1}}
  azure: {{kind: azure, api_key: k, base_url: {url}/azure, api_version: "2024-06-01"}}
  fireworks: {{kind: fireworks, api_key: k, base_url: {url}/fireworks/inference/v1}}
  together: {{kind: together, api_key: k, base_url: {url}/together/v1}}
  deepseek: {{kind: deepseek, api_key: k, base_url: {url}/deepseek}}
  mistral: {{kind: mistral, api_key: k, base_url: {url}/mistral}}
  vllm: {{kind: vllm, base_url: {url}/vllm/v1, discover: false}}
  sglang: {{kind: sglang, base_url: {url}/sglang/v1, discover: false}}
  llamacpp: {{kind: llamacpp, base_url: {url}/llamacpp, discover: false}}
  tgi: {{kind: tgi, base_url: {url}/tgi, discover: false}}
  ollama: {{kind: ollama, base_url: {url}/ollama, discover: false}}
  pais: {{kind: pais, base_url: {url}/pais/api/v1/compatibility/openai/v1}}
  sgp: {{kind: sgp, api_key: k, base_url: {url}/sgp}}
  anthropic: {{kind: anthropic, api_key: k, base_url: {url}/anthropic}}
  gemini: {{kind: gemini, api_key: k, base_url: {url}/gemini}}
  cohere: {{kind: cohere, api_key: k, base_url: {url}/cohere}}
  bedrock:
    kind: bedrock
    region: us-east-1
    api_key: ${{AWS_ACCESS_KEY_ID}}:${{AWS_SECRET_ACCESS_KEY}}
    base_url: {url}/bedrock
"""
GATEWAY_ENV = {"AWS_ACCESS_KEY_ID": AKID, "AWS_SECRET_ACCESS_KEY": SECRET}

MODEL = {kind: f"{kind}/m" for kind in KINDS} | {"bedrock": "bedrock/amazon.nova-micro-v1:0"}


MESSAGES: list[Any] = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"}]


def kind_handler(rel: str) -> Handler:
    raw = fixture_bytes(rel)
    if rel.endswith(".eventstream"):
        return reply_eventstream(raw, 97)
    if rel.endswith(".sse.txt"):
        return reply_sse(sse_events(raw))
    return reply(raw)
