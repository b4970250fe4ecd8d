"""A batch of chat completions (`endpoint: /v1/chat/completions`), as OpenAI's Batch API runs them: each line
answered as the interactive chat route answers it, over a real loopback upstream speaking OpenAI's chat wire
(its answer the recording tests/fixtures/openai/chat_completion.json, the text made from the line's own
message), a chat line's bad body refused by name in the error file, a completion line in a chat batch failing
the batch, and the ledger's rows saying which endpoint served them."""

from __future__ import annotations

import contextlib
import json
import sqlite3
from pathlib import Path
from typing import Any, Final

import httpx
import openai
import pytest
from aiohttp import web

from tests.helpers.recordings import fixture_json
from tests.helpers.servers import GatewayThread
from tests.helpers.upstreams import Received, Upstream

from .conftest import ENV, EVAL_KEY, config, jsonl, line, results, sdk, upload, wait_batch

CHAT: Final = "/v1/chat/completions"


async def _answer(request: web.Request, received: Received) -> web.StreamResponse:
    asked = received.json()
    body = fixture_json("openai/chat_completion.json")
    body["choices"][0]["message"]["content"] = "echo " + asked["messages"][-1]["content"]
    return web.json_response(body)


def chat_line(custom_id: str, text: str, model: str = "local", **body: Any) -> dict[str, Any]:
    messages = [{"role": "user", "content": text}]
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": CHAT,
        "body": {"model": model, "messages": messages, **body},
    }


def _chat_batch(client: openai.OpenAI, lines: list[dict[str, Any]]) -> str:
    return client.batches.create(input_file_id=upload(client, jsonl(lines)), endpoint=CHAT, completion_window="24h").id


def _served(tmp_path: Path, up: Upstream) -> tuple[Path, Path]:
    more = f"""  local: {{kind: openai, base_url: "{up.url}/v1", api_key: sk-up}}"""
    text = config(f"sqlite:///{tmp_path / 'ledger.db'}", more=more)
    text = text.replace(
        "  - {name: fast,", "  - {name: local, targets: [{model: local/gpt-4o-mini}]}\n  - {name: fast,"
    )
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path, tmp_path / "ledger.db"


def test_a_chat_batch_answers_each_line_as_the_chat_route_does(tmp_path: Path) -> None:
    with Upstream() as up:
        up.handler = _answer
        path, db = _served(tmp_path, up)
        lines = [chat_line(f"c-{i}", f"question {i}", max_tokens=8) for i in range(12)]
        lines.append(chat_line("c-bad", "no such model", model="nope/nothing"))
        lines.append({**chat_line("c-field", "x"), "body": {"model": "local", "messages": "not a list"}})
        # Over what the model generates: a check after the field is folded into `max_tokens`.
        lines.append(chat_line("c-neg", "x", model="fast", max_completion_tokens=1_000_000))
        with GatewayThread(path, ENV) as gw:
            client = sdk(gw.url, EVAL_KEY)
            batch = wait_batch(client, _chat_batch(client, lines))
            out, err = results(client, batch.output_file_id), results(client, batch.error_file_id)
            with httpx.Client(base_url=gw.url, headers={"authorization": f"Bearer {EVAL_KEY}"}) as c:
                direct = [c.post(CHAT, json=x["body"]).json() for x in lines[:12]]
            listed = client.batches.list().data
        paths = {r.path for r in up.received}
    assert batch.status == "completed" and batch.endpoint == CHAT
    assert (batch.request_counts.completed, batch.request_counts.failed) == (12, 3)
    assert [o["custom_id"] for o in out] == [f"c-{i}" for i in range(12)]
    for got, want in zip(out, direct, strict=True):
        assert got["response"]["status_code"] == 200 and got["error"] is None
        body = got["response"]["body"]
        assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-") and body["id"] != want["id"]
        assert {**body, "id": None, "created": None} == {**want, "id": None, "created": None}
    assert out[3]["response"]["body"]["choices"][0]["message"] == {"role": "assistant", "content": "echo question 3"}
    assert paths == {"/v1/chat/completions"}  # every line went to the upstream's chat route
    refused = {e["custom_id"]: e["response"] for e in err}
    assert refused["c-bad"]["status_code"] == 404
    assert refused["c-field"]["status_code"] == 400
    assert refused["c-field"]["body"]["error"]["param"] == "messages"
    # A field the gateway folds into another is named as the line sent it, as the chat route names it.
    assert refused["c-neg"]["status_code"] == 400
    assert refused["c-neg"]["body"]["error"]["param"] == "max_completion_tokens"
    assert [b.endpoint for b in listed] == [CHAT]
    # The ledger books each line under the endpoint that served it, with the batch's id (the gateway has
    # stopped: every row it took is committed).
    assert _rows(db, batch.id) == [("chat", 15)]


def _rows(db: Path, batch_id: str) -> list[tuple[str, int]]:
    with contextlib.closing(sqlite3.connect(db)) as conn:
        got = conn.execute(
            "SELECT endpoint, count(*) FROM requests WHERE batch_id = ? GROUP BY endpoint", (batch_id,)
        ).fetchall()
    return [(str(e), int(n)) for e, n in got]


def test_a_chat_batch_is_checked_against_its_own_endpoint(tmp_path: Path) -> None:
    with Upstream() as up:
        up.handler = _answer
        path, _ = _served(tmp_path, up)
        with GatewayThread(path, ENV) as gw:
            client = sdk(gw.url, EVAL_KEY)
            # A completion line in a chat batch fails the batch, naming the line (and a chat line in a
            # completion batch does too).
            mixed = wait_batch(client, _chat_batch(client, [chat_line("a", "hi"), line("b", model="local")]))
            made = client.batches.create(
                input_file_id=upload(client, jsonl([line("a", model="local"), chat_line("b", "hi")])),
                endpoint="/v1/completions",
                completion_window="24h",
            )
            other = wait_batch(client, made.id)
            # A streamed chat line is refused in the error file, as a streamed completion line is.
            streamed = wait_batch(
                client, _chat_batch(client, [chat_line("s", "hi", stream=True), chat_line("t", "ok")])
            )
            err = results(client, streamed.error_file_id)
            # OpenAI's other batch endpoints are not served: refused when the batch is made, naming the field.
            with pytest.raises(openai.BadRequestError) as refused:
                client.batches.create(
                    input_file_id=upload(client, jsonl([chat_line("e", "hi")])),
                    endpoint="/v1/embeddings",
                    completion_window="24h",
                )
        assert len(up.received) == 1  # only the streamed batch's plain line was sent
    for batch in (mixed, other):
        assert batch.status == "failed" and batch.errors is not None
        assert [(e.code, e.line) for e in batch.errors.data] == [("invalid_url", 2)]
    assert streamed.status == "completed" and [e["custom_id"] for e in err] == ["s"]
    assert err[0]["response"]["body"]["error"]["param"] == "stream"
    assert refused.value.status_code == 400 and refused.value.param == "endpoint"
    assert "/v1/chat/completions" in refused.value.message
    assert json.loads(json.dumps(err[0]))["error"] is None
