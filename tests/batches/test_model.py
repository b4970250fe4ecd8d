"""The Batch object's `model`: the model its lines name, read by the unmodified `openai` SDK over a real socket,
null while the file is unchecked and where lines name different models; kept across a restart, on SQLite and
on PostgreSQL."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai

from gateway.batches.lines import MODEL_CHARS, parse
from tests.helpers.postgres import PostgresServer
from tests.helpers.servers import GatewayThread

from .conftest import ENV, EVAL_KEY, config, jsonl, line, sdk, served, upload, wait_batch


def _run(client: openai.OpenAI, lines: list[dict[str, Any]]) -> Any:
    made = client.batches.create(
        input_file_id=upload(client, jsonl(lines)), endpoint="/v1/completions", completion_window="24h"
    )
    return made, wait_batch(client, made.id)


def test_a_batch_names_the_model_its_lines_name(tmp_path: Path) -> None:
    with served(tmp_path) as (_, client):
        made, batch = _run(client, [line(f"m-{i}", model="fast") for i in range(3)])
        assert made.model is None  # not checked yet when it is made
        assert batch.status == "completed" and batch.model == "fast"
        assert client.batches.retrieve(batch.id).model == "fast"
        assert [b.model for b in client.batches.list().data if b.id == batch.id] == ["fast"]
    with served(tmp_path) as (_, client):  # kept with the batch
        assert client.batches.retrieve(batch.id).model == "fast"


def test_lines_naming_different_models_leave_it_null(tmp_path: Path) -> None:
    with served(tmp_path) as (_, client):
        _, mixed = _run(client, [line("a", model="fast"), line("b", model="slow")])
        assert mixed.status == "completed" and mixed.request_counts.completed == 2
        assert mixed.model is None
        # A line whose model is not a string fails on its own; the others still name one model.
        bad = line("c")
        bad["body"]["model"] = 7
        _, one_bad = _run(client, [line("d", model="fast"), bad])
        assert one_bad.request_counts.failed == 1 and one_bad.model is None


def test_a_model_name_no_route_could_have_is_not_shown() -> None:
    long_name = "x" * (MODEL_CHARS + 1)
    for model in (long_name, "fa\x00st", ["fast"], None):
        lines, errors = parse(jsonl([line("a", model=model)]), "/v1/completions", 10, 1 << 20, 1 << 20)  # type: ignore[arg-type]
        assert errors == [] and lines[0].model is None, model
    lines, _ = parse(jsonl([line("a", model="x" * MODEL_CHARS)]), "/v1/completions", 10, 1 << 20, 1 << 20)
    assert lines[0].model == "x" * MODEL_CHARS


def test_model_on_postgresql(tmp_path: Path, pg: PostgresServer) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(config(pg.url))
    with GatewayThread(path, ENV) as gw:
        client = sdk(gw.url, EVAL_KEY)
        _, batch = _run(client, [line("p-1", model="slow"), line("p-2", model="slow")])
        assert batch.model == "slow"
        _, weird = _run(client, [line("p-3", model="fa\x00st")])
        assert weird.status == "completed" and weird.request_counts.failed == 1 and weird.model is None
    with GatewayThread(path, ENV) as gw:
        assert sdk(gw.url, EVAL_KEY).batches.retrieve(batch.id).model == "slow"
