"""A rerun of the same file is answered by the response cache: no upstream call, the same answers."""

from __future__ import annotations

import json
from pathlib import Path

from aiohttp import web

from tests.helpers.servers import GatewayThread
from tests.helpers.upstreams import Received, Upstream

from .conftest import ENV, EVAL_KEY, config, jsonl, line, results, sdk, upload, wait_batch


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


def test_a_rerun_is_answered_from_the_cache(tmp_path: Path) -> None:
    with Upstream() as up:
        up.handler = _answer
        more = f"""  local: {{kind: vllm, base_url: "{up.url}/v1"}}
cache: {{mode: always}}"""
        path = tmp_path / "config.yaml"
        text = config(f"sqlite:///{tmp_path / 'ledger.db'}", more=more)
        path.write_text(
            text.replace("  - {name: fast,", "  - {name: local, targets: [{model: local/m}]}\n  - {name: fast,")
        )
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
