"""A batch's lines run in the `batch` class, below every class a client may ask for: against a server with
`max_concurrency`, interactive requests that wait beside a batch's lines are sent first, even the batch's own
key's, even at `low` priority, and the batch still ends whole."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest

from tests.helpers.engine import Engine
from tests.helpers.redis import RedisServer
from tests.helpers.servers import GatewayThread
from tests.queue.conftest import gate, until

from .conftest import ENV, EVAL_KEY, config, line, results, sdk, start, wait_batch

LINES = 30
CONCURRENCY = 8  # lines one batch has in flight: one holds the server's one slot, the others wait for it
INTERACTIVE = 3


async def test_interactive_requests_go_before_the_lines_of_a_running_batch(tmp_path: Path) -> None:
    with Engine(hold_s=0.02) as engine:
        more = f'  engine: {{kind: vllm, base_url: "{engine.url}/v1", discover: false, max_concurrency: 1}}'
        path = tmp_path / "config.yaml"
        path.write_text(config(f"sqlite:///{tmp_path / 'ledger.db'}", concurrency=CONCURRENCY, more=more))
        with GatewayThread(path, ENV) as gw:
            client = sdk(gw.url, EVAL_KEY)
            g = gate(gw)
            # The engine holds what reaches it: the batch's first line keeps the slot, the rest queue up.
            engine.running.clear()
            lines = [line(f"l-{i}", model="engine/m", prompt=f"batch item {i}") for i in range(LINES)]
            batch_id = start(client, lines)
            await until(lambda: engine.inflight == 1 and g.order.depth == CONCURRENCY - 1)
            async with httpx.AsyncClient(base_url=gw.url, timeout=30) as http:
                # The same key as the batch's, so no fair share between tenants explains the order: only priority.
                asks = [
                    asyncio.ensure_future(
                        http.post(
                            "/v1/completions",
                            json={"model": "engine/m", "prompt": f"inter {i}", "max_tokens": 1},
                            headers={"authorization": f"Bearer {EVAL_KEY}"},
                        )
                    )
                    for i in range(INTERACTIVE)
                ]
                await until(lambda: g.order.depth == CONCURRENCY - 1 + INTERACTIVE)
                engine.running.set()
                t0 = time.monotonic()
                answers = await asyncio.gather(*asks)
                waited = time.monotonic() - t0
                lines_done = sum(1 for tenant, _, _ in engine.done if tenant == "batch")
            batch = await asyncio.to_thread(wait_batch, client, batch_id)
            out = await asyncio.to_thread(results, client, batch.output_file_id)
    assert [r.status_code for r in answers] == [200] * INTERACTIVE
    # First come, first served would put them after the seven lines waiting before them.
    assert engine.order[: 1 + INTERACTIVE] == ["batch"] + ["inter"] * INTERACTIVE, engine.order
    # Their wait was the one line in the server when they came, not the batch's queue (seven more lines).
    assert lines_done <= 1 + INTERACTIVE, (lines_done, waited)
    assert batch.status == "completed" and batch.request_counts.completed == LINES
    assert sorted(o["custom_id"] for o in out) == sorted(f"l-{i}" for i in range(LINES))
    assert engine.order.count("batch") == LINES


@pytest.mark.parametrize("shared", [False, True])
async def test_a_low_priority_keys_requests_go_before_the_lines_of_its_own_batch(
    tmp_path: Path, rds: RedisServer, shared: bool
) -> None:
    """The key asks for `low` by default, so its interactive requests and its batch's lines are one tenant of
    one key: only the lines' own class, below `low`, puts the requests first (on one process's slots, and on
    slots held as leases in Redis, handed out by the gate's pump)."""
    with Engine(hold_s=0.02) as engine:
        more = f'  engine: {{kind: vllm, base_url: "{engine.url}/v1", discover: false, max_concurrency: 1}}'
        if shared:
            more += f"\nredis: {{url: '{rds.url}', on_failure: fail_closed}}"
        text = config(f"sqlite:///{tmp_path / 'ledger.db'}", concurrency=CONCURRENCY, more=more)
        mine = '{name: eval, key: "${BATCH_EVAL_KEY}"}'
        path = tmp_path / "config.yaml"
        path.write_text(text.replace(mine, mine[:-1] + ", priority: low}"))
        with GatewayThread(path, ENV) as gw:
            client = sdk(gw.url, EVAL_KEY)
            g = gate(gw)
            engine.running.clear()
            lines = [line(f"l-{i}", model="engine/m", prompt=f"batch item {i}") for i in range(LINES)]
            batch_id = start(client, lines)
            await until(lambda: engine.inflight == 1 and g.order.depth == CONCURRENCY - 1)
            async with httpx.AsyncClient(base_url=gw.url, timeout=30) as http:
                asks = [
                    asyncio.ensure_future(
                        http.post(
                            "/v1/completions",
                            json={"model": "engine/m", "prompt": f"inter {i}", "max_tokens": 1},
                            headers={"authorization": f"Bearer {EVAL_KEY}"},
                        )
                    )
                    for i in range(INTERACTIVE)
                ]
                await until(lambda: g.order.depth == CONCURRENCY - 1 + INTERACTIVE)
                waiting = list(g.order.counts)  # per class: high, normal, low, batch
                engine.running.set()
                answers = await asyncio.gather(*asks)
            batch = await asyncio.to_thread(wait_batch, client, batch_id)
    assert waiting == [0, 0, INTERACTIVE, CONCURRENCY - 1], waiting
    assert [r.status_code for r in answers] == [200] * INTERACTIVE
    # One tenant's requests in one class would go first come, first served: after the seven lines.
    assert engine.order[: 1 + INTERACTIVE] == ["batch"] + ["inter"] * INTERACTIVE, engine.order
    assert batch.status == "completed" and batch.request_counts.completed == LINES
    assert engine.order.count("batch") == LINES


def test_a_line_may_not_set_the_engines_priority_even_for_a_key_that_may_ask_for_high(tmp_path: Path) -> None:
    """Lines run last: a `priority` in a line's body would put it ahead of the engine's interactive
    requests, so such a line is refused (its error names the field) and the others run."""
    with Engine() as engine:
        more = f'  engine: {{kind: vllm, base_url: "{engine.url}/v1", discover: false}}'
        text = config(f"sqlite:///{tmp_path / 'ledger.db'}", more=more)
        text = text.replace(
            '{name: eval, key: "${BATCH_EVAL_KEY}"}', '{name: eval, key: "${BATCH_EVAL_KEY}", max_priority: high}'
        )
        path = tmp_path / "config.yaml"
        path.write_text(text)
        with GatewayThread(path, ENV) as gw:
            client = sdk(gw.url, EVAL_KEY)
            lines = [
                line("jumps", model="engine/m", prompt="batch a", priority=-(2**31)),
                line("plain", model="engine/m"),
            ]
            batch = wait_batch(client, start(client, lines))
            out, err = results(client, batch.output_file_id), results(client, batch.error_file_id)
            with httpx.Client(base_url=gw.url, timeout=30) as http:
                own = http.post(
                    "/v1/completions",
                    json={"model": "engine/m", "prompt": "inter x", "max_tokens": 1, "priority": -1},
                    headers={"authorization": f"Bearer {EVAL_KEY}"},
                )
    assert [o["custom_id"] for o in out] == ["plain"]
    assert [e["custom_id"] for e in err] == ["jumps"]
    refused = err[0]["response"]
    assert refused["status_code"] == 403
    assert (refused["body"]["error"]["code"], refused["body"]["error"]["param"]) == ("priority_not_allowed", "priority")
    assert own.status_code == 200  # the key itself may, outside a batch
    assert [r.json().get("priority") for r in engine.received] == [None, -1]
