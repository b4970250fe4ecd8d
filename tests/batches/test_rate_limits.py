"""A batch's lines never count toward their key's rate limits (`keys[].limits`: its interactive traffic's), so
a batch cannot leave its key's interactive requests refused with 429; they count toward `batches.limits`, in
buckets of their own per key, and a line over those waits and is sent again, never refused for them."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.helpers.servers import GatewayThread

from .conftest import ADMIN_KEY, ENV, EVAL_KEY, OTHER_KEY, config, interactive, line, results, sdk, start, wait_batch

LINES = 12
RPM = 20  # the key's own limit: a burst of 20, then one every 3 s


def _configured(tmp_path: Path, extra: str = "") -> Path:
    mine = '{name: eval, key: "${BATCH_EVAL_KEY}"}'
    text = config(f"sqlite:///{tmp_path / 'ledger.db'}", concurrency=8, extra=extra)
    path = tmp_path / "config.yaml"
    path.write_text(text.replace(mine, mine[:-1] + f", limits: {{rpm: {RPM}}}}}"))
    return path


def _requeued(gw: GatewayThread) -> float:
    text = httpx.get(gw.url + "/metrics").text
    prefix = 'gateway_batch_lines_requeued_total{code="rate_limit_exceeded"}'
    return sum(float(x.rsplit(" ", 1)[1]) for x in text.splitlines() if x.startswith(prefix))


def test_a_batch_leaves_its_keys_whole_rate_limit_to_its_interactive_requests(tmp_path: Path) -> None:
    lines = [line(f"r-{i}", prompt=f"p {i}") for i in range(LINES)]
    with GatewayThread(_configured(tmp_path), ENV) as gw:
        client = sdk(gw.url, EVAL_KEY)
        batch = wait_batch(client, start(client, lines))
        out = results(client, batch.output_file_id)
        requeued = _requeued(gw)
        # Counted against the key's rpm, the 12 lines would leave 8 of its burst: most of these would be 429s.
        statuses = interactive(gw, RPM)
    assert batch.status == "completed" and batch.error_file_id is None
    assert [o["custom_id"] for o in out] == [x["custom_id"] for x in lines]
    assert requeued == 0
    assert statuses == [200] * RPM, statuses


def test_a_line_over_batches_limits_waits_and_is_sent_again(tmp_path: Path) -> None:
    lines = [line(f"r-{i}", prompt=f"p {i}") for i in range(LINES)]
    with GatewayThread(_configured(tmp_path, extra=", limits: {rps: 5}"), ENV) as gw:
        client = sdk(gw.url, EVAL_KEY)
        batch = wait_batch(client, start(client, lines))
        out = results(client, batch.output_file_id)
        requeued = _requeued(gw)
        statuses = interactive(gw, RPM)
    # Eight lines in flight against a burst of five: some were put back, and sent again after Retry-After.
    assert batch.status == "completed" and batch.error_file_id is None
    assert [o["custom_id"] for o in out] == [x["custom_id"] for x in lines]
    assert requeued >= 1
    assert statuses == [200] * RPM, statuses


def test_a_keys_own_batch_limits_stand_in_for_batches_limits(tmp_path: Path) -> None:
    """`batches.limits` holds every key's lines to rpm 2; the eval key's `batch_limits` lets its lines run at
    rps 100, while the other key's lines still take two and wait 30 s for each one after."""
    mine = '{name: eval, key: "${BATCH_EVAL_KEY}"}'
    text = config(f"sqlite:///{tmp_path / 'ledger.db'}", concurrency=8, extra=", limits: {rpm: 2}")
    path = tmp_path / "config.yaml"
    path.write_text(text.replace(mine, mine[:-1] + ", batch_limits: {rps: 100}}"))
    lines = [line(f"r-{i}", prompt=f"p {i}") for i in range(LINES)]
    with GatewayThread(path, ENV) as gw:
        client, other = sdk(gw.url, EVAL_KEY), sdk(gw.url, OTHER_KEY)
        others = start(other, lines[:4])
        wait_batch(other, others, lambda b: b.request_counts is not None and b.request_counts.completed >= 2)
        # At rps 100 the 12 lines take well under a second. The other batch, left with two lines waiting 30 s,
        # must not hold the room this one takes its lines in: it once did for as long as their polls kept in
        # step (seconds, and past 20 s at times).
        batch = wait_batch(client, start(client, lines), timeout=8)
        out = results(client, batch.output_file_id)
        slow = other.batches.retrieve(others)
        other.batches.cancel(others)
    assert batch.status == "completed" and batch.error_file_id is None
    assert [o["custom_id"] for o in out] == [x["custom_id"] for x in lines]
    assert slow.request_counts is not None and slow.request_counts.completed == 2, slow.request_counts


def test_a_runtime_keys_batch_limits_stand_in_too_and_only_the_operator_sets_them(tmp_path: Path) -> None:
    """A key made by the operator's `POST /admin/keys` with `batch_limits` runs its lines by them, not by
    `batches.limits` (rpm 2); a team's admin may not set them (they would lift the operator's cap)."""
    team_admin = "adm-team-evals-91f0"
    text = config(
        f"sqlite:///{tmp_path / 'ledger.db'}",
        concurrency=8,
        extra=", limits: {rpm: 2}",
        more=f'teams: {{evals: {{admin_key: "{team_admin}"}}}}',
    )
    path = tmp_path / "config.yaml"
    path.write_text(text)
    lines = [line(f"r-{i}", prompt=f"p {i}") for i in range(LINES)]
    with GatewayThread(path, ENV) as gw:
        with httpx.Client(base_url=gw.url, headers={"authorization": f"Bearer {ADMIN_KEY}"}) as adm:
            made = adm.post("/admin/keys", json={"name": "big-evals", "batch_limits": {"rps": 100}})
            listed = adm.get("/admin/keys").json()
        with httpx.Client(base_url=gw.url, headers={"authorization": f"Bearer {team_admin}"}) as team:
            refused = team.post("/admin/keys", json={"name": "sneaky", "batch_limits": {}})
        assert made.status_code == 201, made.text
        client = sdk(gw.url, made.json()["secret"])
        batch = wait_batch(client, start(client, lines), timeout=20)
    assert batch.status == "completed" and batch.request_counts.completed == LINES
    assert made.json()["key"]["batch_limits"]["rps"] == 100
    assert [k["batch_limits"]["rps"] for k in listed["keys"] if k["name"] == "big-evals"] == [100]
    assert refused.status_code == 403
    assert (refused.json()["error"]["code"], refused.json()["error"]["param"]) == ("beyond_team", "batch_limits")
