"""A team's limits (`teams.<name>.limits`) bound all of its keys together, batch lines too: a team admin who
makes more keys gets no more batch throughput. Two keys of a team with an rpm of N each run a batch: their
lines together take `batches.quota_share` of the team's burst and wait, and the team's interactive requests
made meanwhile find the rest. In one process's state and in Redis."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.helpers.servers import GatewayThread

from .conftest import (
    ENV,
    EVAL_KEY,
    OTHER_KEY,
    completed,
    interactive,
    line,
    requeued,
    sdk,
    start,
    team_config,
    wait_batch,
    written,
)

RPM = 6  # the team's limit: a burst of six, then one every 10 s (longer than the test's burst)
LINES = 10


@pytest.mark.parametrize("where", ["in-process", "redis"])
def test_a_teams_keys_batches_together_take_the_teams_share_and_its_interactive_requests_get_the_rest(
    tmp_path: Path, request: pytest.FixtureRequest, where: str
) -> None:
    rds = request.getfixturevalue("rds") if where == "redis" else None
    part = RPM // 2
    with GatewayThread(written(tmp_path, team_config(tmp_path, f"rpm: {RPM}", 0.5, rds)), ENV) as gw:
        mine, other = sdk(gw.url, EVAL_KEY), sdk(gw.url, OTHER_KEY)
        batches = [
            (client, start(client, [line(f"{name}-{i}", prompt=f"{name} {i}") for i in range(LINES)]))
            for client, name in ((mine, "mine"), (other, "other"))
        ]
        deadline = time.monotonic() + 30
        while sum(completed(c, b) for c, b in batches) < part:
            assert time.monotonic() < deadline, "the batches never took their share"
            time.sleep(0.1)
        time.sleep(0.5)  # the lines refused meanwhile are put back and tried again: none may get through
        taken = sum(completed(c, b) for c, b in batches)
        statuses = interactive(gw, RPM - taken + 1)
        after = sum(completed(c, b) for c, b in batches)
        put_back = requeued(gw, "rate_limit_exceeded")
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
    assert put_back >= 1
