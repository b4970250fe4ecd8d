"""A team's limits (`teams.<name>.limits`) bound all of its keys together, batch lines too: a team admin who
makes more keys gets no more batch throughput. Two keys of a team with an rpm of N each run a batch: their
lines together take `batches.quota_share` of the team's burst and wait, and the team's interactive requests
made meanwhile find the rest. A batch longer than its share of the team's burst runs to its end at the team's
pace, each line answered once, while the team's interactive requests are served. A line needing more tokens
than the share of a team's (or its key's own batch) token limit can ever hold fails alone, at once. In one
process's state and in Redis."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from tests.helpers.servers import GatewayThread
from tests.helpers.sqlite import opened

from .conftest import (
    ENV,
    EVAL_KEY,
    OTHER_KEY,
    completed,
    interactive,
    line,
    requeued,
    results,
    sdk,
    share_config,
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


RUN_RPM = 240  # the team's limit: one request every quarter of a second
RUN_SHARE = 0.05  # twelve requests of the team's burst for its lines
RUN_LINES = 16  # four more than that share: they wait for the team's bucket to drain
INTERACTIVE = 3


@pytest.mark.parametrize("where", ["in-process", "redis"])
def test_a_batch_runs_to_completion_through_its_teams_bucket_while_the_teams_interactive_requests_are_served(
    tmp_path: Path, request: pytest.FixtureRequest, where: str
) -> None:
    rds = request.getfixturevalue("rds") if where == "redis" else None
    part = int(RUN_RPM * RUN_SHARE)
    lines = [line(f"run-{i}", prompt=f"run {i}") for i in range(RUN_LINES)]
    with GatewayThread(written(tmp_path, team_config(tmp_path, f"rpm: {RUN_RPM}", RUN_SHARE, rds)), ENV) as gw:
        client = sdk(gw.url, EVAL_KEY)
        began = time.monotonic()
        batch_id = start(client, lines)
        wait_batch(client, batch_id, lambda b: b.request_counts is not None and b.request_counts.completed >= part)
        statuses = interactive(gw, INTERACTIVE)  # the team's own requests, while its lines wait for the bucket
        midway = completed(client, batch_id)
        batch = wait_batch(client, batch_id, timeout=30)
        took = time.monotonic() - began
        out, err = results(client, batch.output_file_id), results(client, batch.error_file_id)
        put_back = requeued(gw, "rate_limit_exceeded")
    with opened(tmp_path / "ledger.db") as conn:
        rows = conn.execute(
            "SELECT team, status, count(*) FROM requests WHERE batch_id = ? GROUP BY team, status", (batch_id,)
        ).fetchall()
    assert statuses == [200] * INTERACTIVE, statuses
    assert midway < RUN_LINES, "the interactive requests were served while the batch still waited"
    assert batch.status == "completed"
    assert (batch.request_counts.completed, batch.request_counts.failed) == (RUN_LINES, 0)
    # Every line answered once, in the input's order, however many times the team's bucket put it back.
    assert [o["custom_id"] for o in out] == [x["custom_id"] for x in lines]
    assert all(o["response"]["status_code"] == 200 for o in out)
    assert err == [] and batch.error_file_id is None
    assert rows == [("evals", 200, RUN_LINES)]
    # The lines past the share went at the team's pace (one each quarter second), after being put back.
    assert put_back >= 1
    assert took >= (RUN_LINES - part) * 60 / RUN_RPM


@pytest.mark.parametrize("scope", ["team:evals", "batch:eval"])  # the team's tpm, or the key's `batch_limits`
def test_a_line_no_share_of_the_teams_or_its_keys_tokens_can_ever_hold_fails_alone_at_once(
    tmp_path: Path, scope: str
) -> None:
    """A line asking for 150 max_tokens, where the team's tpm of 200 leaves lines 100 (`quota_share` 0.5), or
    the key's `batch_limits` a tpm of 100, is in the error file at once, as a request over a whole limit is
    (400 naming the field to lower and the limit): it is not put back to wait for room that never comes. The
    other lines run, and the team's interactive requests of that size are answered (they get the whole
    bucket)."""
    if scope.startswith("team:"):
        text = team_config(tmp_path, "tpm: 200", 0.5)
    else:
        text = share_config(tmp_path, 0.5)
        mine = 'key: "${BATCH_EVAL_KEY}"'
        assert mine in text
        text = text.replace(mine, mine + ", batch_limits: {tpm: 100}")
    lines = [line("small-0"), line("big", max_tokens=150), line("small-1")]
    with GatewayThread(written(tmp_path, text), ENV) as gw:
        client = sdk(gw.url, EVAL_KEY)
        began = time.monotonic()
        batch = wait_batch(client, start(client, lines), timeout=30)
        took = time.monotonic() - began
        out, err = results(client, batch.output_file_id), results(client, batch.error_file_id)
        put_back = requeued(gw, "rate_limit_exceeded")
        with httpx.Client(base_url=gw.url, timeout=30) as http:
            own = http.post(
                "/v1/completions",
                json={"model": "fast", "prompt": "inter", "max_tokens": 150},
                headers={"authorization": f"Bearer {EVAL_KEY}"},
            ).status_code
    assert batch.status == "completed"
    assert (batch.request_counts.completed, batch.request_counts.failed) == (2, 1)
    assert [o["custom_id"] for o in out] == ["small-0", "small-1"]
    assert Counter(e["custom_id"] for e in err) == {"big": 1}
    big = err[0]["response"]
    error = big["body"]["error"]
    assert (big["status_code"], error["code"], error["param"]) == (400, "exceeds_token_limit", "max_tokens")
    assert f"the tpm limit of {200 if scope.startswith('team:') else 100} for {scope}" in error["message"]
    if scope.startswith("team:"):
        assert "quota_share 0.5" in error["message"]
    # Neither waited nor spun: no line was put back, and the batch ended as soon as its lines were answered.
    assert put_back == 0
    assert took < 10
    assert own == 200
