"""A line the gateway has no room for (its wait in a server's queue ran out: 429 `queue_timeout`) is not an
error line: it is put back and sent again after a backoff, for as long as the batch's window lasts. A line put
back is not a request the gateway answered: no ledger row, no request metrics; its access-log entry stays."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.helpers.accesslog import listening
from tests.helpers.engine import Engine
from tests.helpers.servers import GatewayThread
from tests.helpers.sqlite import opened
from tests.queue.conftest import until

from .conftest import ENV, EVAL_KEY, config, line, results, sdk, start, wait_batch

LINES = 4


@pytest.fixture
def engine() -> Iterator[Engine]:
    with Engine() as e:
        yield e


def _served(tmp_path: Path, engine: Engine) -> GatewayThread:
    """The gateway in front of `engine` (one slot), where a batch line waits 100 ms for it at most."""
    more = (
        f'  engine: {{kind: vllm, base_url: "{engine.url}/v1", discover: false, max_concurrency: 1}}\n'
        "queue: {max_wait_by_priority: {low: 100}}"
    )
    path = tmp_path / "config.yaml"
    path.write_text(config(f"sqlite:///{tmp_path / 'ledger.db'}", concurrency=2, more=more))
    return GatewayThread(path, ENV)


async def _hold_the_slot(http: httpx.AsyncClient, engine: Engine) -> asyncio.Future[httpx.Response]:
    """An interactive request that takes the engine's one slot and stays there until `engine.running` is set."""
    engine.running.clear()
    held = asyncio.ensure_future(
        http.post(
            "/v1/completions",
            json={"model": "engine/m", "prompt": "interactive hello", "max_tokens": 1},
            headers={"authorization": f"Bearer {EVAL_KEY}"},
        )
    )
    await until(lambda: engine.inflight == 1)
    return held


def _requeued(text: str) -> float:
    return sum(
        float(x.rsplit(" ", 1)[1])
        for x in text.splitlines()
        if x.startswith('gateway_batch_lines_requeued_total{code="queue_timeout"}')
    )


async def test_a_line_whose_queue_wait_ran_out_is_sent_again_later(tmp_path: Path, engine: Engine) -> None:
    lines = [line(f"q-{i}", model="engine/m", prompt=f"batch item {i}") for i in range(LINES)]
    with listening() as log, _served(tmp_path, engine) as gw:
        gw.pipeline.log_requests = True  # the suite's config turns the access log off; this test reads it
        client = sdk(gw.url, EVAL_KEY)
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as http:
            held = await _hold_the_slot(http, engine)
            batch_id = await asyncio.to_thread(start, client, lines)
            # Both lines in flight wait 100 ms, are refused, wait about a second, and are refused again.
            await until(lambda: _requeued(httpx.get(gw.url + "/metrics").text) >= 4, timeout=15)
            # The lines put back kept their places in batches.concurrency (2): no other line was taken meanwhile.
            with opened(tmp_path / "ledger.db") as conn:
                states = dict(
                    conn.execute(
                        "SELECT state, count(*) FROM batch_lines WHERE batch_id = ? GROUP BY state", (batch_id,)
                    ).fetchall()
                )
            assert states == {"sent": 2, "todo": LINES - 2}, states
            engine.running.set()
            assert (await held).status_code == 200
            batch = await asyncio.to_thread(wait_batch, client, batch_id)
            out = await asyncio.to_thread(results, client, batch.output_file_id)
            text = (await http.get("/metrics")).text
    assert batch.status == "completed" and batch.error_file_id is None
    assert (batch.request_counts.completed, batch.request_counts.failed) == (LINES, 0)
    assert [o["custom_id"] for o in out] == [x["custom_id"] for x in lines]
    assert all(o["response"]["status_code"] == 200 for o in out)
    # A refused line never reached the engine: each line was sent to it once, after the slot freed.
    assert engine.order.count("batch") == LINES
    assert _requeued(text) >= 4
    assert 'gateway_batch_lines_total{status="failed"}' not in text
    # A line put back was not answered: the ledger holds one row per line, its reports count each line once,
    # and no request of the key's was counted as refused. The access log shows every refusal, with the batch.
    with opened(tmp_path / "ledger.db") as conn:
        rows = conn.execute("SELECT status, count(*) FROM requests WHERE batch_id = ? GROUP BY status", (batch_id,))
        assert rows.fetchall() == [(200, LINES)]
        daily = conn.execute("SELECT sum(requests), sum(errors) FROM daily WHERE key_name = 'eval'").fetchone()
    assert daily == (LINES + 1, 0)  # the lines and the interactive request that held the slot
    assert not [x for x in text.splitlines() if x.startswith("gateway_requests_total") and 'status="429"' in x]
    refusals = [e for e in log.lines if e.get("batch_id") == batch_id and e["status"] == 429]
    assert len(refusals) >= 4 and {e["error"] for e in refusals} == {"queue_timeout"}


async def test_lines_put_back_until_the_window_ends_are_expired(tmp_path: Path, engine: Engine) -> None:
    lines = [line(f"x-{i}", model="engine/m", prompt=f"batch item {i}") for i in range(LINES)]
    with _served(tmp_path, engine) as gw:
        client = sdk(gw.url, EVAL_KEY)
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as http:
            held = await _hold_the_slot(http, engine)
            try:
                batch_id = await asyncio.to_thread(start, client, lines, "3s")
                batch = await asyncio.to_thread(wait_batch, client, batch_id)
                text = (await http.get("/metrics")).text
            finally:
                engine.running.set()
            assert (await held).status_code == 200
            err = await asyncio.to_thread(results, client, batch.error_file_id)
    assert batch.status == "expired" and batch.output_file_id is None
    assert sorted(e["custom_id"] for e in err) == sorted(x["custom_id"] for x in lines)
    # Not one 429 line: every line waited for room until the window closed, as OpenAI reports expiry.
    assert {e["error"]["code"] for e in err} == {"batch_expired"} and all(e["response"] is None for e in err)
    assert _requeued(text) >= 4
    assert "batch" not in engine.order
