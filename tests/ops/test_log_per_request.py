"""A request is not a log line of the gateway process: not through the httpx transport either.

httpx writes `HTTP Request: POST ... "HTTP/1.1 200 OK"` at INFO for every call; the gateway's own log
config keeps such lines out (the access log says what happened, once). Over real sockets: the CLI as a
child process, a loopback upstream on `transport: httpx`.
"""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.helpers.servers import GatewayProcess, cli_env
from tests.helpers.upstreams import Upstream, reply

ANSWER = (
    b'{"id": "c", "object": "text_completion", "created": 1, "model": "m", "choices": [{"index": 0, '
    b'"text": "ok", "finish_reason": "stop"}], '
    b'"usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}'
)


def test_calls_through_httpx_write_no_line_each(tmp_path: Path) -> None:
    with Upstream() as upstream:
        upstream.handler = reply(ANSWER)
        config = tmp_path / "httpx.yaml"
        config.write_text(
            "logging: {requests: false}\n"
            f"providers:\n  up: {{kind: vllm, base_url: {upstream.url}/v1, transport: httpx, discover: false}}\n"
        )
        gw = GatewayProcess(config, cli_env())
        try:
            gw.wait_ready()
            with httpx.Client(trust_env=False, timeout=10) as c:
                for i in range(5):
                    r = c.post(f"{gw.url}/v1/completions", json={"model": "up/m", "prompt": f"p{i}"})
                    assert r.status_code == 200, r.text
        finally:
            gw.stop()
    assert len(upstream.received) == 5
    log = gw.log.read_text()
    assert "HTTP Request" not in log and upstream.url not in log, log
