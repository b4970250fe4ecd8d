"""A batch's lines take at most `batches.quota_share` of a shared quota (an alias's, a provider's): with a
provider's rpm of N and a share of 0.5, a batch of many lines takes half of the burst and waits, and the
interactive requests made meanwhile find the other half; a share of 1 lets the batch take it all, as before
there was a share; a share of less than one request lets one line through at a time, while the bucket is
otherwise empty. In one process's state and in Redis. A line needing more tokens than a share could ever
hold is refused (400, in the error file) rather than kept waiting for room that never comes."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import httpx
import pytest

from tests.helpers.redis import RedisServer
from tests.helpers.servers import GatewayThread

from .conftest import (
    ENV,
    EVAL_KEY,
    completed,
    interactive,
    line,
    results,
    sdk,
    share_config,
    start,
    wait_batch,
    written,
)

RPM = 6  # the provider's quota: a burst of six, then one every 10 s (longer than each test's burst)
LINES = 20
PAIR = "  - {name: pair, targets: [{model: demo/text}, {model: demo/slow-40ms}]}"


def _configured(
    tmp_path: Path,
    share: float,
    rds: RedisServer | None,
    limits: str = f"rpm: {RPM}",
    provider: str = "",
    scope: str = "provider",
) -> Path:
    """The suite's config with `limits` on the `demo` provider (or, `scope="alias"`, on the alias `fast`),
    `batches.quota_share`, the alias `pair` (two targets of that provider), a `provider` line of YAML more,
    and Redis when `rds` is given."""
    text = share_config(tmp_path, share, rds, provider)
    if scope == "alias":
        fast = "{name: fast, targets: [{model: demo/text}]}"
        text = text.replace(fast, fast[:-1] + f", limits: {{{limits}}}}}")
    else:
        text = text.replace(
            "demo: {kind: fake, models: [text, slow-40ms, slow-400ms]}",
            f"demo: {{kind: fake, models: [text, slow-40ms, slow-400ms], limits: {{{limits}}}}}",
        )
    text = text.replace("models:\n", "models:\n" + PAIR + "\n")
    assert f"limits: {{{limits}}}" in text
    return written(tmp_path, text)


def _share_run(
    tmp_path: Path, share: float, rds: RedisServer | None, model: str, scope: str = "provider"
) -> tuple[int, int, list[int]]:
    """A batch of LINES lines against the quota's burst: the lines it answered once it stopped for room, the
    interactive statuses of the burst's worth of requests made then, and its lines answered after them."""
    lines = [line(f"q-{i}", model=model, prompt=f"p {i}") for i in range(LINES)]
    with GatewayThread(_configured(tmp_path, share, rds, scope=scope), ENV) as gw:
        client = sdk(gw.url, EVAL_KEY)
        batch_id = start(client, lines)
        part = max(int(RPM * share), 1)  # a share of less than one request holds one
        wait_batch(client, batch_id, lambda b: b.request_counts is not None and b.request_counts.completed >= part)
        time.sleep(0.5)  # the lines refused meanwhile are put back and tried again: none may get through
        taken = completed(client, batch_id)
        statuses = interactive(gw, RPM - taken + 1)
        after = completed(client, batch_id)
        client.batches.cancel(batch_id)
        ended = wait_batch(client, batch_id)
    assert ended.status == "cancelled"
    return taken, after, statuses


@pytest.mark.parametrize("model", ["fast", "pair"])  # the provider's quota charged at admission, or per target
@pytest.mark.parametrize("where", ["in-process", "redis"])
def test_a_batch_takes_its_share_of_a_providers_burst_and_interactive_requests_get_the_rest(
    tmp_path: Path, request: pytest.FixtureRequest, where: str, model: str
) -> None:
    rds = request.getfixturevalue("rds") if where == "redis" else None
    taken, after, statuses = _share_run(tmp_path, 0.5, rds, model)
    # Half of the burst of six: three lines, and the fourth waits for the bucket to drain under the half.
    assert taken == RPM // 2
    # The other half is the interactive requests', whole: three answered, and only then the bucket is full.
    assert statuses == [200] * (RPM - taken) + [429], statuses
    assert after == taken


def test_an_aliass_limits_are_shared_the_same_way(tmp_path: Path) -> None:
    taken, after, statuses = _share_run(tmp_path, 0.5, None, "fast", scope="alias")
    assert taken == RPM // 2
    assert statuses == [200] * (RPM - taken) + [429], statuses
    assert after == taken


@pytest.mark.parametrize("where", ["in-process", "redis"])
def test_a_share_of_1_lets_a_batch_take_the_whole_burst(
    tmp_path: Path, request: pytest.FixtureRequest, where: str
) -> None:
    rds = request.getfixturevalue("rds") if where == "redis" else None
    taken, after, statuses = _share_run(tmp_path, 1.0, rds, "fast")
    assert taken == RPM
    assert statuses == [429], statuses
    assert after == RPM


@pytest.mark.parametrize("where", ["in-process", "redis"])
def test_a_share_of_less_than_one_request_lets_one_line_through_and_interactive_requests_get_the_rest(
    tmp_path: Path, request: pytest.FixtureRequest, where: str
) -> None:
    rds = request.getfixturevalue("rds") if where == "redis" else None
    taken, after, statuses = _share_run(tmp_path, 0.1, rds, "fast")  # 0.6 of a request of the burst of six
    assert taken == 1
    assert statuses == [200] * (RPM - 1) + [429], statuses
    assert after == 1


def test_a_line_no_share_can_ever_hold_is_refused_at_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Half of a tpm of 200 is 100 tokens: a line asking for 150 max_tokens is refused as a request over a
    whole limit is, naming the field to lower. Half of an rps of 1 is less than one request: the lines there
    go through one a second, and the gateway said so as it loaded the config. The other lines run, and
    interactive requests of either size are answered."""
    tiny = "  tiny: {kind: fake, models: [text], limits: {rps: 1}}"
    path = _configured(tmp_path, 0.5, None, limits="tpm: 200", provider=tiny)
    lines = [
        line("big", max_tokens=150),
        line("small"),
        *(line(f"tiny-{i}", model="tiny/text") for i in range(3)),
    ]
    with GatewayThread(path, ENV) as gw:
        client = sdk(gw.url, EVAL_KEY)
        began = time.monotonic()
        batch = wait_batch(client, start(client, lines))
        took = time.monotonic() - began
        out, err = results(client, batch.output_file_id), results(client, batch.error_file_id)
        time.sleep(1.1)  # the last line's request drains from the rps of 1
        with httpx.Client(base_url=gw.url, timeout=30) as http:
            own = [
                http.post(
                    "/v1/completions",
                    json={"model": model, "prompt": "inter", "max_tokens": tokens},
                    headers={"authorization": f"Bearer {EVAL_KEY}"},
                ).status_code
                for model, tokens in (("fast", 100), ("tiny/text", 5))
            ]
    assert batch.status == "completed"
    assert [o["custom_id"] for o in out] == ["small", "tiny-0", "tiny-1", "tiny-2"]
    assert took >= 2, "one line a second through the rps of 1"
    refused = {e["custom_id"]: e["response"] for e in err}
    assert sorted(refused) == ["big"]
    big = refused["big"]
    assert (big["status_code"], big["body"]["error"]["code"], big["body"]["error"]["param"]) == (
        400,
        "exceeds_token_limit",
        "max_tokens",
    )
    assert "quota_share" in big["body"]["error"]["message"]
    assert own == [200, 200]
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "quota_share" in r.message]
    assert warned == [
        "batches.quota_share 0.5 leaves batch lines less than one request of the rps limit of 1 for provider:tiny: "
        "its lines go one at a time, each only while nothing else holds that bucket"
    ]
