"""A line goes through the request path an interactive request of its key takes: another dialect's field
names, an alias and its fallbacks, the upstream's own refusal (a line in the error file, with the upstream's
status and message), and the key's `models` patterns (a model it may not call is a 403 line, not a failed
batch)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aiohttp import web

from tests.helpers.servers import GatewayThread
from tests.helpers.upstreams import Received, Upstream

from .conftest import ENV, EVAL_KEY, OTHER_KEY, config, line, results, sdk, start, wait_batch

REFUSAL = "This prompt is refused by the upstream's policy"


async def _answer(request: web.Request, received: Received) -> web.StreamResponse:
    asked = received.json()
    if str(asked["prompt"]).startswith("refuse"):
        error = {"message": REFUSAL, "type": "invalid_request_error", "param": "prompt", "code": None}
        return web.json_response({"error": error}, status=400)
    body = {
        "id": "cmpl-up",
        "object": "text_completion",
        "created": 1,
        "model": asked["model"],
        "choices": [{"index": 0, "text": f"echo {asked['prompt']}", "finish_reason": "stop", "logprobs": None}],
        "usage": {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4},
    }
    return web.json_response(body)


async def _overloaded(request: web.Request, received: Received) -> web.StreamResponse:
    return web.json_response({"error": {"message": "overloaded", "type": "server_error"}}, status=503)


def test_a_line_takes_the_path_of_an_interactive_request(tmp_path: Path) -> None:
    with Upstream() as up, Upstream() as down:
        up.handler, down.handler = _answer, _overloaded
        more = f"""  local: {{kind: vllm, base_url: "{up.url}/v1", discover: false}}
  broken: {{kind: vllm, base_url: "{down.url}/v1", discover: false}}"""
        text = config(f"sqlite:///{tmp_path / 'ledger.db'}", more=more).replace(
            "retries: {attempts: 1}", "retries: {attempts: 3}"
        )
        text = text.replace(
            "  - {name: fast,",
            "  - {name: local, targets: [{model: local/m}]}\n"
            "  - {name: chain, targets: [{model: broken/m}], fallbacks: [local]}\n"
            "  - {name: fast,",
        )
        path = tmp_path / "config.yaml"
        path.write_text(text)
        mine: list[dict[str, Any]] = [
            # SGP's field names, as an interactive request may send them on /v1/completions.
            {
                **line("sgp"),
                "body": {"model": "local", "prompt": "sgp names", "max_new_tokens": 3, "stop_sequences": ["##"]},
            },
            line("fallback", model="chain", prompt="fall back"),
            line("refused", model="local", prompt="refuse this one"),
        ]
        theirs = [line("allowed", model="fast"), line("not-allowed", model="local", prompt="not mine")]
        with GatewayThread(path, ENV) as gw:
            client, other = sdk(gw.url, EVAL_KEY), sdk(gw.url, OTHER_KEY)
            batch = wait_batch(client, start(client, mine))
            out, err = results(client, batch.output_file_id), results(client, batch.error_file_id)
            their_batch = wait_batch(other, start(other, theirs))
            their_out = results(other, their_batch.output_file_id)
            their_err = results(other, their_batch.error_file_id)
        upstream = {r.json()["prompt"]: r.json() for r in up.received}
    assert batch.status == "completed" and (batch.request_counts.completed, batch.request_counts.failed) == (2, 1)
    answered = {o["custom_id"]: o["response"]["body"] for o in out}
    assert answered["sgp"]["choices"][0]["text"] == "echo sgp names"
    assert upstream["sgp names"]["max_tokens"] == 3 and upstream["sgp names"]["stop"] == ["##"]
    assert "max_new_tokens" not in upstream["sgp names"]
    # The alias's target failed (503, retried); its fallback answered.
    assert answered["fallback"]["choices"][0]["text"] == "echo fall back"
    assert len(down.received) >= 1 and "fall back" in upstream
    [refused] = err
    assert refused["custom_id"] == "refused" and refused["error"] is None
    assert refused["response"]["status_code"] == 400
    assert REFUSAL in refused["response"]["body"]["error"]["message"]
    # The other key may call `fast` only: its line for `local` is refused as its interactive request would be.
    assert their_batch.status == "completed" and [o["custom_id"] for o in their_out] == ["allowed"]
    assert [(e["custom_id"], e["response"]["status_code"]) for e in their_err] == [("not-allowed", 403)]
    assert their_err[0]["response"]["body"]["error"]["code"] == "model_not_allowed"
    assert "not mine" not in upstream
