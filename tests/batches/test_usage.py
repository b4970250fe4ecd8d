"""A batch's `usage`: the tokens of its answers, as the output file reports them and the ledger books them, read
by the unmodified `openai` SDK over a real socket, kept across a restart."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.helpers.recordings import fixture_bytes, fixture_json
from tests.helpers.sqlite import opened
from tests.helpers.upstreams import Upstream, reply

from .conftest import jsonl, line, results, served, upload, wait_batch

RECORDED = "openai/chat_o3mini_stop_sequence.json"  # o3-mini's answer: 448 of its 467 output tokens reasoning


def _chat_line(custom_id: str, model: str = "openai/o3-mini") -> dict[str, Any]:
    body = {"model": model, "messages": [{"role": "user", "content": "The capital of France?"}], "stop": ["Paris"]}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


def test_a_batch_sums_its_answers_tokens_into_its_usage(tmp_path: Path) -> None:
    recorded = fixture_json(RECORDED)["usage"]
    with Upstream() as up:
        up.handler = reply(fixture_bytes(RECORDED))
        more = f"  openai: {{kind: openai, api_key: k, base_url: {up.url}/v1}}"
        with served(tmp_path, more=more) as (_, client):
            lines = [_chat_line(f"c-{i}") for i in range(3)] + [_chat_line("c-bad", model="nope/nothing")]
            made = client.batches.create(
                input_file_id=upload(client, jsonl(lines)), endpoint="/v1/chat/completions", completion_window="24h"
            )
            assert made.usage is not None and made.usage.total_tokens == 0  # nothing answered yet
            batch = wait_batch(client, made.id)
            assert batch.status == "completed" and batch.request_counts.failed == 1
            answers = [o["response"]["body"]["usage"] for o in results(client, batch.output_file_id)]
            assert len(answers) == 3 and answers[0]["prompt_tokens"] == recorded["prompt_tokens"]
    usage = batch.usage
    assert usage is not None
    assert usage.input_tokens == sum(a["prompt_tokens"] for a in answers) == 3 * recorded["prompt_tokens"]
    assert usage.output_tokens == sum(a["completion_tokens"] for a in answers) == 3 * recorded["completion_tokens"]
    assert usage.output_tokens_details.reasoning_tokens == 3 * recorded["completion_tokens_details"]["reasoning_tokens"]
    assert usage.input_tokens_details.cached_tokens == 0
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    with opened(tmp_path / "ledger.db") as conn:  # the ledger's rows of the batch say the same
        booked = conn.execute(
            "SELECT sum(prompt_tokens), sum(completion_tokens) FROM requests WHERE batch_id = ?", (batch.id,)
        ).fetchone()
    assert booked == (usage.input_tokens, usage.output_tokens)
    with served(tmp_path) as (_, client):  # kept in the database: a restarted gateway reads the same
        again = client.batches.retrieve(batch.id)
        assert again.usage == usage
        listed = client.batches.list().data
        assert [b.usage for b in listed if b.id == batch.id] == [usage]


def test_a_completions_batch_counts_the_fake_providers_usage(tmp_path: Path) -> None:
    with served(tmp_path) as (_, client):
        lines = [line(f"f-{i}", prompt=f"question {i} about foxes") for i in range(5)]
        batch = wait_batch(
            client,
            client.batches.create(
                input_file_id=upload(client, jsonl(lines)), endpoint="/v1/completions", completion_window="24h"
            ).id,
        )
        out = [o["response"]["body"]["usage"] for o in results(client, batch.output_file_id)]
    assert batch.usage is not None and batch.usage.input_tokens == sum(u["prompt_tokens"] for u in out) > 0
    assert batch.usage.output_tokens == sum(u["completion_tokens"] for u in out) > 0
    assert batch.usage.output_tokens_details.reasoning_tokens == 0


def test_an_upstreams_absurd_token_details_stay_within_their_totals(tmp_path: Path) -> None:
    # The recorded answer with its details made hostile: reasoning past any 64-bit sum, cached below zero.
    answer = fixture_json(RECORDED)
    answer["usage"]["completion_tokens_details"]["reasoning_tokens"] = 2**63 - 1
    answer["usage"]["prompt_tokens_details"]["cached_tokens"] = -5
    with Upstream() as up:
        up.handler = reply(json.dumps(answer).encode())
        more = f"  openai: {{kind: openai, api_key: k, base_url: {up.url}/v1}}"
        with served(tmp_path, more=more) as (_, client):
            made = client.batches.create(
                input_file_id=upload(client, jsonl([_chat_line(f"h-{i}") for i in range(3)])),
                endpoint="/v1/chat/completions",
                completion_window="24h",
            )
            batch = wait_batch(client, made.id)
    assert batch.status == "completed" and batch.request_counts.completed == 3
    usage = batch.usage
    completion = 3 * answer["usage"]["completion_tokens"]
    assert usage.output_tokens_details.reasoning_tokens == usage.output_tokens == completion
    assert usage.input_tokens_details.cached_tokens == 0


def test_a_batchs_invented_model_names_share_one_rollup(tmp_path: Path) -> None:
    # Each line's row is booked with its line (not by the writer): its rollup names the model as the
    # config does (`demo/other`), as an interactive request's does; the row keeps the name asked for.
    with served(tmp_path) as (_, client):
        lines = [line(f"m-{i}", model=f"demo/invented-{i}") for i in range(6)]
        batch = wait_batch(
            client,
            client.batches.create(
                input_file_id=upload(client, jsonl(lines)), endpoint="/v1/completions", completion_window="24h"
            ).id,
        )
        assert batch.request_counts is not None and batch.request_counts.completed == 6
    with opened(tmp_path / "ledger.db") as db:
        rolled = db.execute("SELECT model, target, sum(requests) FROM daily GROUP BY model, target").fetchall()
        asked = db.execute("SELECT count(DISTINCT model) FROM requests").fetchone()
    assert [tuple(r) for r in rolled] == [("demo/other", "demo/other", 6)]
    assert tuple(asked) == (6,)
