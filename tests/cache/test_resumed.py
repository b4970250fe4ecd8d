"""A stream resumed on another target is relayed whole but never stored: its text came from two models."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.helpers.clients import sse_data
from tests.helpers.faults import FaultServer, continuation, cut, good
from tests.helpers.pipelines import config_yaml
from tests.helpers.servers import serve_config

MODELS = """
  - name: smart
    strategy: ordered
    targets: [{model: alpha/davinci-002}, {model: beta/davinci-002}]
    resume_streams: true
    cache: {mode: always}
"""
TOP = "retries: {attempts: 3}\ntimeouts: {connect_ms: 1000, first_byte_ms: 2000, total_ms: 5000}\n"
BODY = {"model": "smart", "prompt": "Say this is a test", "max_tokens": 16, "stream": True}


@pytest.fixture
def faults() -> Iterator[FaultServer]:
    with FaultServer() as server:
        yield server


def test_a_resumed_stream_is_not_stored(faults: FaultServer, tmp_path: Path) -> None:
    faults["alpha"].script(cut(5))
    faults["beta"].script(continuation(prompt_tokens=13))
    text = config_yaml(faults, MODELS, top=TOP, providers=("alpha", "beta"))
    with serve_config(tmp_path, text) as gw, httpx.Client(base_url=gw.url, timeout=20, trust_env=False) as c:
        resumed = c.post("/v1/completions", json=BODY)
        assert resumed.status_code == 200 and resumed.headers["x-gateway-cache"] == "miss"
        assert sse_data(resumed.text)[-1] == "[DONE]"
        assert faults.order() == ["alpha", "beta"]
        again = c.post("/v1/completions", json=BODY, headers={"cache-control": "only-if-cached"})
        assert again.status_code == 504 and again.json()["error"]["code"] == "cache_miss"
        # An unbroken stream of the same request is stored.
        faults["beta"].script(good())
        whole = c.post("/v1/completions", json=BODY)
        assert whole.headers["x-gateway-cache"] == "miss"
        hit = c.post("/v1/completions", json=BODY, headers={"cache-control": "only-if-cached"})
        assert hit.status_code == 200 and hit.headers["x-gateway-cache"] == "hit"
