"""A config reload (SIGHUP) that changes `ledger.*`: the rest of the file is applied, the ledger is kept
as it started (same database, same settings), and one WARNING names the settings not applied, which
`gateway_config_reload_ignored_total{setting}` counts. `python -m gateway serve` runs as a child, as an
operator runs it."""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path

import httpx

from tests.helpers.clients import body, client
from tests.helpers.servers import GatewayProcess, cli_env
from tests.helpers.waiting import wait_until

from .conftest import ENV, SOLO_KEY, config, query

POLL_S = 2.0  # gateway.ops.reload.Reloader's file poll period
EXTRA = "  - {name: extra, targets: [{model: demo/long}]}\n"
WARNING = re.compile(r" WARNING gateway\[\d+\]: (config reload: .*)")


def served(gw: GatewayProcess, model: str) -> int:
    with client(gw.url, SOLO_KEY) as c:
        return c.post("/v1/completions", json=body(model=model)).status_code


def ignored(gw: GatewayProcess) -> dict[str, float]:
    text = httpx.get(gw.url + "/metrics", trust_env=False).text
    found = re.findall(r'^gateway_config_reload_ignored_total\{setting="([^"]+)"\} (\S+)$', text, re.M)
    return {setting: float(value) for setting, value in found}


def reload(gw: GatewayProcess, path: Path, text: str) -> list[str]:
    """Write `text`, send SIGHUP, wait for the reload; the WARNING lines logged, after one poll period more
    (in which the file poll must not reload the same edit again)."""
    path.write_text(text)
    gw.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: "config reloaded (SIGHUP)" in gw.log.read_text(), timeout=5)
    time.sleep(POLL_S * 1.5)
    return WARNING.findall(gw.log.read_text())


def test_a_reload_keeps_the_ledger_says_so_once_and_counts_it(tmp_path: Path) -> None:
    first, second = tmp_path / "first.db", tmp_path / "second.db"
    path = tmp_path / "config.yaml"
    path.write_text(config(f"sqlite:///{first}"))
    gw = GatewayProcess(path, cli_env(**ENV))
    try:
        gw.wait_ready()
        assert served(gw, "fast") == 200
        assert ignored(gw) == {}
        warnings = reload(gw, path, config(f"sqlite:///{second}", flush_ms=250) + EXTRA)
        assert warnings == [
            f"config reload: ledger.url, ledger.flush_ms changed in {path} but not applied: the ledger is set up "
            "at start and keeps its settings until the gateway restarts"
        ]
        assert ignored(gw) == {"ledger.url": 1.0, "ledger.flush_ms": 1.0}
        # The rest of the file applies; the ledger is the one the gateway started with.
        assert served(gw, "extra") == 200
        wait_until(lambda: query(f"sqlite:///{first}", "SELECT count(*) FROM requests")[0][0] == 2)
        assert not second.exists()
        # Back to what it started with: nothing to say.
        assert reload(gw, path, config(f"sqlite:///{first}")) == warnings
        assert ignored(gw) == {"ledger.url": 1.0, "ledger.flush_ms": 1.0}
    finally:
        gw.stop()


def test_a_ledger_added_by_a_reload_is_not_started(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    without = config("").replace('ledger: {url: "", flush_ms: 100, keys_poll_ms: 200}\n', "")
    assert "ledger" not in without
    path.write_text(without)
    gw = GatewayProcess(path, cli_env(**ENV))
    try:
        gw.wait_ready()
        warnings = reload(gw, path, config(f"sqlite:///{tmp_path / 'added.db'}"))
        assert warnings == [
            f"config reload: ledger.url, ledger.flush_ms, ledger.keys_poll_ms changed in {path} but not applied: "
            "the ledger is set up at start and stays off (none was configured) until the gateway restarts"
        ]
        assert ignored(gw) == {"ledger.url": 1.0, "ledger.flush_ms": 1.0, "ledger.keys_poll_ms": 1.0}
        assert served(gw, "fast") == 200
        assert not (tmp_path / "added.db").exists()
    finally:
        gw.stop()
