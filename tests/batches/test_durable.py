"""A batch survives its gateway: SIGKILLed mid-run three times, `python -m gateway serve` resumes it at start-up
(without waiting for the dead process's lease) and every custom_id is answered exactly once; a line booked is
never sent again, as a loopback upstream that outlives the gateways counts."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path

from aiohttp import web

from tests.helpers.servers import GatewayChild, cli_env
from tests.helpers.sqlite import opened
from tests.helpers.upstreams import Received, Upstream

from .conftest import ENV, EVAL_KEY, config, jsonl, line, results, sdk, upload, wait_batch


def _progress(db: Path, batch_id: str) -> tuple[str, int]:
    with opened(db, timeout=10) as conn:
        row = conn.execute("SELECT status, completed FROM batches WHERE id = ?", (batch_id,)).fetchone()
    return (str(row[0]), int(row[1])) if row else ("", 0)


async def _answer(request: web.Request, received: Received) -> web.StreamResponse:
    await asyncio.sleep(0.04)
    asked = received.json()
    choice = {"index": 0, "text": f"echo {asked['prompt']}", "finish_reason": "stop", "logprobs": None}
    usage = {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4}
    return web.json_response(
        {"id": "c", "object": "text_completion", "created": 1, "choices": [choice], "usage": usage}
    )


def test_sigkill_three_times_then_exactly_once(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    path = tmp_path / "config.yaml"
    concurrency = 4
    up = Upstream()  # in this process: it outlives every gateway killed, and counts what each line cost it
    up.handler = _answer
    up.start()
    # A lease far longer than the test: the restarted gateway resumes because the holder's process is gone.
    more = f'  local: {{kind: vllm, base_url: "{up.url}/v1", discover: false}}'
    path.write_text(config(f"sqlite:///{db}", lease_ms=600_000, concurrency=concurrency, more=more))
    lines = [line(f"k-{i}", model="local/m", prompt=f"prompt number {i}") for i in range(160)]
    gw = GatewayChild(path, env=cli_env(**ENV))
    kills = 0
    try:
        gw.wait_ready()
        client = sdk(gw.url, EVAL_KEY)
        made = client.batches.create(
            input_file_id=upload(client, jsonl(lines)), endpoint="/v1/completions", completion_window="24h"
        )
        for threshold in (15, 55, 100):
            deadline = time.monotonic() + 60
            while _progress(db, made.id)[1] < threshold:
                assert time.monotonic() < deadline, _progress(db, made.id)
                time.sleep(0.02)
            gw.stop()  # SIGKILL
            kills += 1
            assert _progress(db, made.id)[0] == "in_progress"
            gw = GatewayChild(path, env=cli_env(**ENV))
            gw.wait_ready()
        client = sdk(gw.url, EVAL_KEY)
        batch = wait_batch(client, made.id)
        assert batch.status == "completed"
        out, err = results(client, batch.output_file_id), results(client, batch.error_file_id)
    finally:
        gw.stop()
        up.stop()
    assert err == []
    assert [o["custom_id"] for o in out] == [x["custom_id"] for x in lines]  # each once, in the file's order
    assert all(o["response"]["status_code"] == 200 for o in out)
    with opened(db) as conn:
        rows = conn.execute("SELECT custom_id, sends FROM batch_lines WHERE batch_id = ?", (made.id,))
        sends = {str(c): int(n) for c, n in rows}
    # A line is sent again only when it was in flight at a kill: at most `concurrency` lines per kill, once each.
    assert all(1 <= s <= 1 + kills for s in sends.values())
    assert len(sends) < sum(sends.values()) <= len(sends) + kills * concurrency
    # What the upstream saw: every line, and a line twice only when it was marked sent at a kill (a line marked
    # but killed before its request left counts a send the upstream never saw).
    seen = Counter(r.json()["prompt"] for r in up.received)
    by_prompt = {x["body"]["prompt"]: sends[x["custom_id"]] for x in lines}
    assert set(seen) == set(by_prompt) and all(1 <= seen[p] <= by_prompt[p] for p in seen)
    assert sum(seen.values()) <= len(lines) + kills * concurrency


def test_sigterm_hands_the_batch_back_for_the_next_gateway(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    path = tmp_path / "config.yaml"
    path.write_text(config(f"sqlite:///{db}", lease_ms=600_000, concurrency=4))
    lines = [line(f"t-{i}", model="slow", prompt=f"prompt {i}") for i in range(80)]
    gw = GatewayChild(path, env=cli_env(**ENV))
    try:
        gw.wait_ready()
        client = sdk(gw.url, EVAL_KEY)
        made = client.batches.create(
            input_file_id=upload(client, jsonl(lines)), endpoint="/v1/completions", completion_window="24h"
        )
        deadline = time.monotonic() + 60
        while _progress(db, made.id)[1] < 20:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        gw.sigterm()
        gw.proc.wait(20)
        gw.stop()  # closes its log
        with opened(db) as conn:
            until, sent = conn.execute(
                "SELECT lease_until, (SELECT count(*) FROM batch_lines WHERE batch_id = ? AND sends > 0 "
                "AND result IS NULL) FROM batches WHERE id = ?",
                (made.id, made.id),
            ).fetchone()
        assert until == 0  # handed back: no process waits for the lease to run out
        assert sent <= 4  # only lines in flight at the signal are unanswered: every answer that came is booked
        gw = GatewayChild(path, env=cli_env(**ENV))
        gw.wait_ready()
        batch = wait_batch(sdk(gw.url, EVAL_KEY), made.id)
        out = results(sdk(gw.url, EVAL_KEY), batch.output_file_id)
    finally:
        gw.stop()
    assert batch.status == "completed" and [o["custom_id"] for o in out] == [x["custom_id"] for x in lines]


def test_two_workers_each_line_sent_once(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    path = tmp_path / "config.yaml"
    path.write_text(config(f"sqlite:///{db}", concurrency=4, more="server: {workers: 2}"))
    gw = GatewayChild(path, env=cli_env(**ENV))
    try:
        gw.wait_ready()
        client = sdk(gw.url, EVAL_KEY)
        made = [
            client.batches.create(
                input_file_id=upload(
                    client, jsonl([line(f"{b}-{i}", model="slow", prompt=f"{b} {i}") for i in range(40)])
                ),
                endpoint="/v1/completions",
                completion_window="24h",
            ).id
            for b in "ab"
        ]
        batches = [wait_batch(client, m) for m in made]
        outs = [results(client, b.output_file_id) for b in batches]
    finally:
        gw.stop()
    for b, out in zip("ab", outs, strict=True):
        assert [o["custom_id"] for o in out] == [f"{b}-{i}" for i in range(40)]
    with opened(db) as conn:
        assert conn.execute("SELECT max(sends) FROM batch_lines").fetchone() == (1,)
