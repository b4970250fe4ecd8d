"""An upstream that rate-limits (429 with Retry-After) cools its target, and the lines that come while every
target is cooling (429 `all_targets_cooling`) are lines the gateway had no room for: put back and sent again
once the cooldown ends, not written to the error file, as an interactive client told to retry would."""

from __future__ import annotations

from pathlib import Path

import httpx
from aiohttp import web

from tests.helpers.servers import GatewayThread
from tests.helpers.upstreams import Received, Upstream

from .conftest import ENV, EVAL_KEY, config, line, results, sdk, start, wait_batch

LINES = 6
REFUSED = 2  # the upstream's first answers are 429s


class _Limited(Upstream):
    def __init__(self) -> None:
        super().__init__()
        self.handler = self._answer

    async def _answer(self, request: web.Request, received: Received) -> web.StreamResponse:
        if len(self.received) <= REFUSED:
            err = {"error": {"message": "slow down", "type": "rate_limit_error", "code": "rate_limit_exceeded"}}
            return web.json_response(err, status=429, headers={"retry-after": "1"})
        choice = {"index": 0, "text": "ok", "finish_reason": "stop", "logprobs": None}
        usage = {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
        return web.json_response(
            {"id": "c", "object": "text_completion", "created": 1, "choices": [choice], "usage": usage}
        )


def _requeued(text: str) -> dict[str, float]:
    prefix = "gateway_batch_lines_requeued_total{code="
    return {x.split('"')[1]: float(x.rsplit(" ", 1)[1]) for x in text.splitlines() if x.startswith(prefix)}


def test_lines_meeting_a_cooling_upstream_wait_for_it(tmp_path: Path) -> None:
    with _Limited() as up:
        path = tmp_path / "config.yaml"
        more = f'  local: {{kind: vllm, base_url: "{up.url}/v1", discover: false}}'
        path.write_text(config(f"sqlite:///{tmp_path / 'ledger.db'}", concurrency=2, more=more))
        lines = [line(f"u-{i}", model="local/m", prompt=f"p {i}") for i in range(LINES)]
        with GatewayThread(path, ENV) as gw:
            client = sdk(gw.url, EVAL_KEY)
            batch = wait_batch(client, start(client, lines))
            out = results(client, batch.output_file_id)
            err = results(client, batch.error_file_id)
            text = httpx.get(gw.url + "/metrics").text
    assert [(e["response"]["status_code"], e["response"]["body"]["error"]["code"]) for e in err] == []
    assert batch.status == "completed" and [o["custom_id"] for o in out] == [x["custom_id"] for x in lines]
    assert sum(_requeued(text).values()) >= REFUSED, _requeued(text)
