"""A client that leaves while its request waits on upstreams is booked with what those calls cost.

docs/observability.md: `attempts` in the access log and the ledger, and `gateway_retries_total`, count
every upstream call, hedges included, for a request that was answered or not. docs/ratelimits.md: a
request the client cancels is charged its prompt, streamed or not, once an upstream took it. Real
sockets: the gateway under uvicorn, an HTTP client that gives up, loopback upstreams that never answer.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.e2e.test_observability import metric
from tests.helpers.accesslog import listening
from tests.helpers.faults import FaultServer, hang
from tests.helpers.servers import serve_config
from tests.helpers.waiting import wait_until


@pytest.mark.parametrize("streamed", [False, True], ids=["buffered", "streamed"])
def test_a_client_gone_during_a_hedge_is_booked_with_both_calls(
    faults: FaultServer, tmp_path: Path, streamed: bool
) -> None:
    faults["alpha"].script(hang())
    faults["beta"].script(hang())
    config = (
        "timeouts: {first_byte_ms: 60000, total_ms: 600000}\n"
        f"providers:\n  alpha: {{kind: openai, api_key: sk-a, base_url: '{faults['alpha'].base_url}'}}\n"
        f"  beta: {{kind: openai, api_key: sk-b, base_url: '{faults['beta'].base_url}'}}\n"
        "models:\n  - name: smart\n    strategy: ordered\n    hedge_after_ms: 100\n"
        "    targets: [{model: alpha/davinci-002}, {model: beta/davinci-002}]\n"
    )
    body = {"model": "smart", "prompt": "Say this is a test", "stream": streamed}
    with listening() as access, serve_config(tmp_path, config) as gw:
        with httpx.Client(trust_env=False, timeout=0.6) as c, pytest.raises(httpx.ReadTimeout):
            c.post(gw.url + "/v1/completions", json=body)  # leaves after 0.6 s: both calls are waiting
        wait_until(lambda: len(access.lines) == 1, timeout=10)
        with httpx.Client(trust_env=False, timeout=10) as c:
            text = c.get(gw.url + "/metrics").text
    assert (faults["alpha"].count, faults["beta"].count) == (1, 1)
    # Both connections were closed when the client left.
    wait_until(lambda: faults["alpha"].hits[0].disconnected.is_set() and faults["beta"].hits[0].disconnected.is_set())
    line = access.lines[0]
    assert (line["status"], line["error"], line["attempts"]) == (499, "client_closed_request", 2), line
    assert metric(text, "gateway_retries_total", model="smart") == 1
    assert metric(text, "gateway_requests_total", model="smart", status="499") == 1
    # The prompt the upstream took is booked, on the latest target called.
    assert (line["provider"], line["target"], line["prompt_tokens"]) == ("beta", "beta/davinci-002", 5), line
    assert line["usage_estimated"] is True


def test_a_stream_left_before_its_first_event_is_charged_its_prompt(faults: FaultServer, tmp_path: Path) -> None:
    faults["up"].script(hang())
    config = (
        "timeouts: {first_byte_ms: 60000, total_ms: 600000}\n"
        f"providers:\n  up: {{kind: openai, api_key: sk-up, base_url: '{faults['up'].base_url}'}}\n"
    )
    body = {"model": "up/davinci-002", "prompt": "Say this is a test", "stream": True}
    with listening() as access, serve_config(tmp_path, config) as gw:
        with httpx.Client(trust_env=False, timeout=0.4) as c, pytest.raises(httpx.ReadTimeout):
            c.post(gw.url + "/v1/completions", json=body)
        wait_until(lambda: len(access.lines) == 1, timeout=10)
        with httpx.Client(trust_env=False, timeout=10) as c:
            text = c.get(gw.url + "/metrics").text
    line = access.lines[0]
    assert (line["status"], line["attempts"], line["provider"], line["prompt_tokens"]) == (499, 1, "up", 5), line
    assert line["usage_estimated"] is True
    assert metric(text, "gateway_tokens_total", kind="prompt") == 5
