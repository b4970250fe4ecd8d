"""Live reload as an operator drives it: `python -m gateway serve` as a child, its file edited, SIGHUP sent.

One edit reloads once (a SIGHUP and the file poll do not both reload it) and says so in one INFO line; a
file that does not load logs exactly one ERROR naming the YAML path and the running config stays, and
the watch goes on: a later edit (a key revoked) is applied without a signal; an emptied file (saved in
place, caught between truncation and write) is never loaded; a URL holding a password is
refused by both without showing it, and so is a key's model pattern naming no provider. `check-config`
refuses a CA bundle that is not PEM in one line naming its YAML path, as the transport would fail on it. A
SIGHUP that lists the same replicas in another order keeps a cooling replica cooling.
"""

from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path

import httpx
import pytest
from aiohttp import web

from tests.helpers.servers import GatewayProcess, run_cli
from tests.helpers.upstreams import Received, Upstream, reply
from tests.helpers.waiting import wait_until

POLL_S = 2.0  # gateway.ops.reload.Reloader's file poll period

BASE = """
keys:
  - {name: alice, key: k-alice}
  - {name: bob, key: k-bob}
providers:
  demo: {kind: fake, models: [echo]}
"""
ALIAS = "models:\n  - {name: smart, targets: [{model: demo/echo}]}\n"
RELOADED = re.compile(r" (\w+) gateway\[\d+\]: config reloaded \((SIGHUP|file changed)\)")
FAILED = re.compile(r" (\w+) gateway\[\d+\]: config reload \((SIGHUP|file changed)\) failed")


def status(gw: GatewayProcess, key: str, model: str = "demo/echo") -> int:
    with httpx.Client(base_url=gw.url, trust_env=False, timeout=10) as c:
        body = {"model": model, "prompt": "hi", "max_tokens": 2}
        return c.post("/v1/completions", json=body, headers={"authorization": f"Bearer {key}"}).status_code


def not_pem(tmp_path: Path) -> Path:
    bundle = tmp_path / "ca.pem"
    bundle.write_text("this is not a PEM certificate\n")
    return bundle


def with_bad_bundle(tmp_path: Path) -> str:
    bundle = not_pem(tmp_path)
    return BASE + f"  tls: {{kind: openai, api_key: sk-x, base_url: https://127.0.0.1:9/v1, ca_bundle: {bundle}}}\n"


def test_one_edit_and_a_sighup_reload_once_at_info(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(BASE)
    gw = GatewayProcess(path)
    try:
        gw.wait_ready()
        assert status(gw, "k-alice", "smart") == 404
        path.write_text(BASE + ALIAS)
        gw.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: status(gw, "k-alice", "smart") == 200, timeout=5)
        # Proving that the poll does not reload the same edit again takes one poll period.
        time.sleep(POLL_S * 1.5)
        reloads = RELOADED.findall(gw.log.read_text())
        assert reloads == [("INFO", "SIGHUP")], gw.log.read_text()
    finally:
        gw.stop()


def kept_then_next_edit_loaded(gw: GatewayProcess, path: Path) -> None:
    """The running config stays (bob's key works); a later edit, with no signal, revoking bob's key is loaded."""
    assert status(gw, "k-bob") == 200
    path.write_text(BASE.replace("  - {name: bob, key: k-bob}\n", ""))
    wait_until(lambda: status(gw, "k-bob") == 401, timeout=POLL_S * 3)
    assert status(gw, "k-alice") == 200


def test_a_bad_file_logs_one_error_and_the_watch_goes_on(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(BASE)
    gw = GatewayProcess(path)
    try:
        gw.wait_ready()
        path.write_text(with_bad_bundle(tmp_path))
        gw.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: FAILED.search(gw.log.read_text()) is not None, timeout=5)
        time.sleep(POLL_S * 1.5)  # the poll has seen the same bad file by now: it must not say it again
        log = gw.log.read_text()
        assert FAILED.findall(log) == [("ERROR", "SIGHUP")], log
        line = next(x for x in log.splitlines() if FAILED.search(x))
        assert "providers.tls.ca_bundle" in line and "PEM" in line, line
        assert "Traceback" not in log, log
        kept_then_next_edit_loaded(gw, path)
    finally:
        gw.stop()


def test_an_emptied_file_is_not_loaded_and_the_next_edit_is(tmp_path: Path) -> None:
    """A file saved in place is empty for a moment (truncated, then written): a poll, or a SIGHUP, that finds
    it so keeps the running config, every key and provider, and says so once."""
    path = tmp_path / "config.yaml"
    path.write_text(BASE)
    gw = GatewayProcess(path)
    try:
        gw.wait_ready()
        path.write_text("")
        wait_until(lambda: FAILED.search(gw.log.read_text()) is not None, timeout=POLL_S * 3)
        gw.proc.send_signal(signal.SIGHUP)
        time.sleep(POLL_S * 1.5)
        log = gw.log.read_text()
        assert FAILED.findall(log) == [("ERROR", "file changed"), ("ERROR", "SIGHUP")], log
        assert "config.yaml: the file is empty" in log, log
        kept_then_next_edit_loaded(gw, path)
    finally:
        gw.stop()


def test_check_config_refuses_a_ca_bundle_that_is_not_pem(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(with_bad_bundle(tmp_path))
    done = run_cli(["check-config", str(path)])
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert f"{path}: providers.tls.ca_bundle: cannot be loaded as PEM CA certificates" in lines[0]


def test_a_url_holding_a_password_is_refused_in_one_line_that_does_not_show_it(tmp_path: Path) -> None:
    """The same bad edit through check-config and through a reload: one line naming the YAML path, no password."""
    path = tmp_path / "config.yaml"
    bad = BASE + "  local: {kind: vllm, base_url: 'admin:s3cr3t-pw@127.0.0.1:8000/v1'}\n"
    path.write_text(bad)
    done = run_cli(["check-config", str(path)])
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.strip().splitlines() == [
        f"config error: {path}: providers.local.base_url: must start with http:// or https://"
    ], done.stderr
    path.write_text(BASE)
    gw = GatewayProcess(path)
    try:
        gw.wait_ready()
        path.write_text(bad)
        gw.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: FAILED.search(gw.log.read_text()) is not None, timeout=5)
        log = gw.log.read_text()
        failed = [x for x in log.splitlines() if FAILED.search(x)]
        assert len(failed) == 1 and failed[0].endswith("providers.local.base_url: must start with http:// or https://")
        assert "s3cr3t" not in log and "Traceback" not in log, log
        assert status(gw, "k-bob") == 200  # the running config stays
    finally:
        gw.stop()


def test_a_reload_naming_no_provider_in_a_keys_models_is_refused_and_the_running_config_stays(
    tmp_path: Path,
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(BASE)
    gw = GatewayProcess(path)
    try:
        gw.wait_ready()
        path.write_text(BASE.replace("{name: bob, key: k-bob}", "{name: bob, key: k-bob, models: [dmeo/*]}"))
        gw.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: FAILED.search(gw.log.read_text()) is not None, timeout=5)
        log = gw.log.read_text()
        failed = [x for x in log.splitlines() if FAILED.search(x)]
        assert len(failed) == 1, log
        assert failed[0].endswith(
            "keys[1].models[0]: the key could never call it: 'dmeo/*' names no provider 'dmeo' (providers: demo) "
            "and no alias"
        ), failed[0]
        assert status(gw, "k-bob") == 200  # the running config stays: bob may still call every model
    finally:
        gw.stop()


@pytest.mark.parametrize(
    "edit,problem",
    [
        ("keys:\n  - {name: alice, key: k-alice, team: blu}\n", "keys[0].team: no team 'blu' under teams:"),
        ("timeouts: {connect_ms: 9000, total_ms: 3000}\n", "timeouts.connect_ms: 9000 is above total_ms 3000"),
        ("models:\n  - {name: smart, targets: [{model: demo/echo}], fallbacks: [smart]}\n", "a fallback cycle"),
        ("models:\n  - {name: smart, targets: [{model: demo/echo, weight: .inf}]}\n", "must be a finite number"),
        ("logging: requests: true\n", "line 4, column 18: mapping values are not allowed here"),
        (
            "keys:\n  - {name: alice, key: k-alice, models: [demo/*, dmeo/*]}\n",
            "keys[0].models[1]: the key could never call it: 'dmeo/*' names no provider 'dmeo' (providers: demo)",
        ),
        ("prices: {echo: {prompt_per_1m: 1}}\n", "prices.echo: never applies: 'echo' is neither an alias nor"),
    ],
)
def test_serve_and_check_config_refuse_a_contradiction_in_one_line(tmp_path: Path, edit: str, problem: str) -> None:
    """Start-up and `check-config` run the same checks: exit 1, one line naming the file and the YAML path."""
    path = tmp_path / "config.yaml"
    path.write_text(BASE.replace("keys:\n  - {name: alice, key: k-alice}\n  - {name: bob, key: k-bob}\n", "") + edit)
    for args in (["check-config", str(path)], ["serve", "--config", str(path), "--port", "0"]):
        done = run_cli(args)
        assert done.returncode == 1, done.stdout + done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"config error: {path}: ") and problem in lines[0], lines


def test_a_sighup_that_reorders_replicas_keeps_a_cooling_replica_cooling(tmp_path: Path) -> None:
    async def rate_limited(request: web.Request, received: Received) -> web.StreamResponse:
        return web.json_response({"error": {"message": "slow down"}}, status=429, headers={"retry-after": "60"})

    choice = {"index": 0, "text": "ok", "logprobs": None, "finish_reason": "stop"}
    body = json.dumps({"id": "c", "object": "text_completion", "created": 1, "model": "m", "choices": [choice]})
    limited, fine = Upstream(), Upstream()
    limited.handler, fine.handler = rate_limited, reply(body.encode())
    limited.start()
    fine.start()

    def config(*ups: Upstream) -> str:
        listed = ", ".join(f"{u.url}/v1" for u in ups)
        return (
            "providers:\n  engine:\n    kind: vllm\n    discover: false\n    models: [m]\n"
            f"    replicas: [{listed}]\n    routing: {{policy: round_robin}}\n"
        )

    def asked() -> int:
        return sum(1 for r in limited.received if r.path.endswith("/completions"))

    path = tmp_path / "config.yaml"
    path.write_text(config(limited, fine))
    gw = GatewayProcess(path)
    try:
        gw.wait_ready()
        for _ in range(2):  # round robin: one reached the rate-limited replica, cooling it for its Retry-After
            assert status(gw, "none", "engine/m") == 200
        assert asked() == 1
        path.write_text(config(fine, limited))  # the same replicas, the other way round
        gw.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: len(RELOADED.findall(gw.log.read_text())) == 1, timeout=5)
        for _ in range(4):
            assert status(gw, "none", "engine/m") == 200
        assert asked() == 1  # still cooling: the reload moved no state, and dropped none
    finally:
        gw.stop()
        limited.stop()
        fine.stop()
