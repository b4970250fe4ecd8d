"""A retry whose wait would carry the request past its deadline is not waited for.

docs/resilience.md, "Waits": the client gets the upstream's failure (its cause, its Retry-After) at
once, as when the wait would not fit `budget_ms`, not a `deadline_exceeded` after sleeping past
`total_ms`. Real sockets: the gateway under uvicorn and a loopback upstream.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from tests.e2e.test_observability import metric
from tests.helpers.accesslog import listening
from tests.helpers.faults import FaultServer, unavailable
from tests.helpers.servers import serve_config
from tests.helpers.waiting import wait_until


def test_a_retry_after_past_the_deadline_answers_the_failure_at_once(faults: FaultServer, tmp_path: Path) -> None:
    faults["up"].script(unavailable(retry_after="3"))
    config = (
        "retries: {attempts: 3, budget_ms: 30000}\n"
        "timeouts: {total_ms: 1000}\n"
        f"providers:\n  up: {{kind: openai, api_key: sk-up, base_url: '{faults['up'].base_url}'}}\n"
    )
    with listening() as access, serve_config(tmp_path, config) as gw, httpx.Client(trust_env=False, timeout=30) as c:
        began = time.monotonic()
        r = c.post(gw.url + "/v1/completions", json={"model": "up/davinci-002", "prompt": "Say this is a test"})
        took = time.monotonic() - began
        wait_until(lambda: len(access.lines) == 1)
        text = c.get(gw.url + "/metrics").text
    assert took < 1.0, took  # not the 3 s Retry-After, which no retry within the deadline could wait out
    assert faults["up"].count == 1
    assert r.status_code == 502, r.text
    assert r.headers["retry-after"] == "3"
    assert r.headers["x-gateway-attempts"] == "1"
    assert r.json()["error"]["code"] != "deadline_exceeded"
    line = access.lines[0]
    assert (line["status"], line["cause"], line["target"], line["attempts"]) == (502, "http_503", "up/davinci-002", 1)
    assert metric(text, "gateway_upstream_failures_total", provider="up", cause="http_503") == 1
    assert metric(text, "gateway_retries_total") == 0
