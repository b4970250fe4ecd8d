"""A team's limits (`teams.<name>.limits`) bound all of its keys together, batch lines too: a team admin who
makes more keys gets no more batch throughput. Two keys of a team with an rpm of N each run a batch: their
lines together take `batches.quota_share` of the team's burst and wait, and the team's interactive requests
made meanwhile find the rest. In one process's state and in Redis."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import openai
import pytest

from tests.helpers.redis import RedisServer
from tests.helpers.servers import GatewayThread

from .conftest import ENV, EVAL_KEY, OTHER_KEY, config, interactive, line, sdk, start, wait_batch

RPM = 6  # the team's limit: a burst of six, then one every 10 s (longer than the test's burst)
LINES = 10


def _configured(tmp_path: Path, rds: RedisServer | None) -> Path:
    """The suite's config with both of its keys in the team `evals`, whose rpm is RPM, and a share of 0.5."""
    more = f"teams: {{evals: {{limits: {{rpm: {RPM}}}}}}}"
    if rds is not None:
        more += f"\nredis: {{url: '{rds.url}', on_failure: fail_closed}}"
    text = config(f"sqlite:///{tmp_path / 'ledger.db'}", concurrency=8, extra=", quota_share: 0.5", more=more)
    for key in ('key: "${BATCH_EVAL_KEY}"', 'key: "${BATCH_OTHER_KEY}"'):
        assert key in text
        text = text.replace(key, key + ", team: evals")
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


def _completed(client: openai.OpenAI, batch_id: str) -> int:
    counts = client.batches.retrieve(batch_id).request_counts
    assert counts is not None
    return counts.completed


@pytest.mark.parametrize("where", ["in-process", "redis"])
def test_a_teams_keys_batches_together_take_the_teams_share_and_its_interactive_requests_get_the_rest(
    tmp_path: Path, request: pytest.FixtureRequest, where: str
) -> None:
    rds = request.getfixturevalue("rds") if where == "redis" else None
    part = RPM // 2
    with GatewayThread(_configured(tmp_path, rds), ENV) as gw:
        mine, other = sdk(gw.url, EVAL_KEY), sdk(gw.url, OTHER_KEY)
        batches = [
            (client, start(client, [line(f"{name}-{i}", prompt=f"{name} {i}") for i in range(LINES)]))
            for client, name in ((mine, "mine"), (other, "other"))
        ]
        deadline = time.monotonic() + 30
        while sum(_completed(c, b) for c, b in batches) < part:
            assert time.monotonic() < deadline, "the batches never took their share"
            time.sleep(0.1)
        time.sleep(0.5)  # the lines refused meanwhile are put back and tried again: none may get through
        taken = sum(_completed(c, b) for c, b in batches)
        statuses = interactive(gw, RPM - taken + 1)
        after = sum(_completed(c, b) for c, b in batches)
        metrics = httpx.get(gw.url + "/metrics").text
        for client, batch_id in batches:
            client.batches.cancel(batch_id)
        ended = [wait_batch(c, b) for c, b in batches]
    # Half of the team's burst of six across both keys, not half per key (or the whole burst each).
    assert taken == part
    # The other half is the team's interactive requests', whole: three answered, then the team's bucket is full.
    assert statuses == [200] * (RPM - taken) + [429], statuses
    assert after == taken
    assert [b.status for b in ended] == ["cancelled", "cancelled"]
    # The lines the team's bucket refused were put back to be sent again, as any rate-limited line is.
    prefix = 'gateway_batch_lines_requeued_total{code="rate_limit_exceeded"}'
    assert sum(float(x.rsplit(" ", 1)[1]) for x in metrics.splitlines() if x.startswith(prefix)) >= 1
