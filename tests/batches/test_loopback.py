"""Batches over real loopback upstreams: a 500-line file over a fleet of two replicas, answered as directly,
with `batches.concurrency` lines in flight at most; a rerun of the same file answered by the response cache,
with no upstream call."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import httpx
from aiohttp import web

from tests.helpers.servers import GatewayThread
from tests.helpers.upstreams import Received, Upstream

from .conftest import ENV, EVAL_KEY, config, jsonl, line, results, sdk, start, upload, wait_batch


async def _answer(request: web.Request, received: Received) -> web.StreamResponse:
    asked = received.json()
    body = {
        "id": "cmpl-up",
        "object": "text_completion",
        "created": 1,
        "model": asked["model"],
        "choices": [{"index": 0, "text": f"echo {asked['prompt']}", "finish_reason": "stop", "logprobs": None}],
        "usage": {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4},
    }
    return web.json_response(body)


def _with_local(text: str) -> str:
    """The suite's config with an alias `local` for the loopback provider's model."""
    return text.replace("  - {name: fast,", "  - {name: local, targets: [{model: local/m}]}\n  - {name: fast,")


def test_a_rerun_is_answered_from_the_cache(tmp_path: Path) -> None:
    with Upstream() as up:
        up.handler = _answer
        more = f"""  local: {{kind: vllm, base_url: "{up.url}/v1"}}
cache: {{mode: always}}"""
        path = tmp_path / "config.yaml"
        text = config(f"sqlite:///{tmp_path / 'ledger.db'}", more=more)
        path.write_text(_with_local(text))
        lines = [line(f"r-{i}", model="local", prompt=f"item {i}") for i in range(40)]
        with GatewayThread(path, ENV) as gw:
            client = sdk(gw.url, EVAL_KEY)
            runs = []
            for _ in range(2):
                made = client.batches.create(
                    input_file_id=upload(client, jsonl(lines)), endpoint="/v1/completions", completion_window="24h"
                )
                batch = wait_batch(client, made.id)
                assert batch.status == "completed"
                runs.append(results(client, batch.output_file_id))
                if len(runs) == 1:
                    assert len(up.received) == 40
            assert len(up.received) == 40  # the second run made no upstream call
    first, second = ([(o["custom_id"], o["response"]["body"]["choices"]) for o in run] for run in runs)
    assert first == second and first[3][1][0]["text"] == "echo item 3"
    assert json.loads(json.dumps(runs[1][0]))["response"]["status_code"] == 200


class _Peak:
    """Requests both replicas hold at once (each upstream answers on its own thread), and the most seen."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = self.most = 0

    async def answer(self, request: web.Request, received: Received) -> web.StreamResponse:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
        try:
            await asyncio.sleep(0.005)  # long enough for the lines sent together to overlap
            return await _answer(request, received)
        finally:
            with self.lock:
                self.now -= 1


def test_a_500_line_batch_over_two_replicas_answers_as_directly(tmp_path: Path) -> None:
    concurrency = 16
    peak = _Peak()
    with Upstream() as one, Upstream() as two:
        one.handler = two.handler = peak.answer
        more = f"""  local: {{kind: vllm, replicas: ["{one.url}/v1", "{two.url}/v1"]}}"""
        path = tmp_path / "config.yaml"
        text = config(f"sqlite:///{tmp_path / 'ledger.db'}", more=more, concurrency=concurrency)
        path.write_text(_with_local(text))
        lines = [line(f"f-{i:03}", model="local", prompt=f"fleet item {i}") for i in range(500)]
        with GatewayThread(path, ENV) as gw:
            client = sdk(gw.url, EVAL_KEY)
            batch = wait_batch(client, start(client, lines))
            assert batch.status == "completed"
            assert (batch.request_counts.completed, batch.request_counts.failed) == (500, 0)
            out = results(client, batch.output_file_id)
            assert len(one.received) > 100 and len(two.received) > 100  # both replicas served lines
            assert len(one.received) + len(two.received) == 500
            # batches.concurrency bounds the lines in flight, and the batch uses all of it.
            assert peak.most == concurrency, peak.most
            with httpx.Client(base_url=gw.url, headers={"authorization": f"Bearer {EVAL_KEY}"}) as c:
                direct = [c.post("/v1/completions", json=x["body"]).json() for x in lines]
    assert [o["custom_id"] for o in out] == [x["custom_id"] for x in lines]
    for got, want in zip(out, direct, strict=True):  # every line's body is the interactive answer
        assert got["response"]["status_code"] == 200 and got["error"] is None
        body = got["response"]["body"]
        assert body["id"].startswith("cmpl-") and body["id"] != want["id"]  # the gateway's id of each answer
        assert {**body, "id": None} == {**want, "id": None}  # all else as answered directly
