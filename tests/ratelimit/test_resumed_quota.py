"""A broken chat stream's continuation is charged the quota of the target it resumes on, whatever its plan.

A chat continuation goes only to the targets whose chat route can continue an assistant message: of an alias
of OpenAI (which cannot) and vLLM, to vLLM alone, a plan of one route, as a direct request's is. Before, an
attempt on a one-route plan was taken for one whose quota admission had charged with the request, and the
continuation called vLLM past its `rpm: 1`. Over real sockets: the gateway under uvicorn and one loopback
upstream playing both providers (the limits in process: the path that charges them is the same with Redis).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.helpers.chat_scripts import Script, scripted, vllm_stream
from tests.helpers.clients import sse_data
from tests.helpers.servers import GatewayThread, serve_config
from tests.helpers.upstreams import Upstream

CONFIG = """
server: {{host: 127.0.0.1, port: 0}}
retries: {{attempts: 1}}
providers:
  oa: {{kind: openai, base_url: {u}/oa/v1, api_key: sk-oa}}
  beta: {{kind: vllm, base_url: {u}/beta/v1, limits: {{rpm: 1}}}}
models:
  - name: from-openai
    strategy: ordered
    targets: [{{model: oa/gpt-4o-mini}}, {{model: beta/m}}]
    resume_streams: true
"""
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
PIECES = ["The", " capital", " of", " France", " is", " Paris", "."]


@pytest.fixture
def gateway(upstream: Upstream, tmp_path: Path) -> Iterator[GatewayThread]:
    with serve_config(tmp_path, CONFIG.format(u=upstream.url), {}) as gw:
        yield gw


def _stream(gateway: GatewayThread) -> list[dict[str, object]]:
    body = {"model": "from-openai", "messages": MESSAGES, "stream": True, "max_tokens": 20}
    with httpx.Client(base_url=gateway.url, trust_env=False, timeout=15) as http:
        resp = http.post("/v1/chat/completions", json=body)
    assert resp.status_code == 200, resp.text
    data = sse_data(resp.text)
    assert data[-1] == "[DONE]"
    return [json.loads(d) for d in data[:-1]]


def test_a_chat_continuation_on_a_single_target_is_charged_its_quota(
    gateway: GatewayThread, upstream: Upstream
) -> None:
    script: Script = scripted(upstream, gateway)
    script.behaviours["oa"] = vllm_stream(PIECES[:3], usage=None, cut=True)
    script.behaviours["beta"] = vllm_stream(PIECES[3:], usage=None)
    first = _stream(gateway)
    assert all("error" not in c for c in first), first
    assert len(script.received["beta"]) == 1  # resumed there, within its quota of one a minute
    gateway.pipeline.health.reset()  # the break cooled oa: the second request starts there again
    second = _stream(gateway)
    assert "error" in second[-1], second  # the break's error: beta's quota has no room for a continuation
    assert len(script.received["oa"]) == 2 and len(script.received["beta"]) == 1
