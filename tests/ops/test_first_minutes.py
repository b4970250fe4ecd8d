"""A newcomer's first minutes with the shipped config, as real `python -m gateway serve` processes.

`make run` installs the runtime dependencies only and `make test` the dev tools, each saying so first and
showing pip's progress; `serve` reads a `.env` beside the config (the environment wins); without an admin key
`GET /` is 404 like the rest of the admin surface; what cannot be called (key unset, nobody listening) is
shown unavailable with its reason and left out of `GET /v1/models`; start-up prints one request that works,
and it does.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers.recordings import REPO
from tests.helpers.servers import GatewayProcess, cli_env, free_port, run_cli
from tests.helpers.waiting import wait_until

ADMIN = "first-minutes-admin"


def _shipped(tmp_path: Path, env_file: str | None = None) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text((REPO / "config.yaml").read_text())
    if env_file is not None:
        (tmp_path / ".env").write_text(env_file)
    return path


def _no_vllm(**extra: str) -> dict[str, str]:
    # `local` (vLLM) points at a port nobody listens on, as on a laptop without vLLM.
    env = cli_env(VLLM_BASE_URL=f"http://127.0.0.1:{free_port()}/v1", **extra)
    if "GATEWAY_ADMIN_KEY" not in extra:
        env.pop("GATEWAY_ADMIN_KEY", None)
    return env


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_run_and_make_test_say_what_they_install_and_show_progress(tmp_path: Path) -> None:
    """On a fresh clone (no .venv): what `make run` would do, then what it does once the dev tools are in."""
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy(REPO / name, tmp_path / name)

    def dry_run(*targets: str) -> list[str]:
        # A `make test PYTEST_ARGS=...` above this run passes its variables down through MAKEFLAGS: drop them.
        env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "PYTEST_ARGS")}
        result = subprocess.run(
            ["make", "--no-print-directory", "-n", *targets],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            check=True,
            env=env,
        )
        return result.stdout.splitlines()

    run = dry_run("run")
    installs = [line for line in run if " install " in line]
    assert installs and all("[dev]" not in line and " -q" not in line for line in installs), run
    assert any(line.endswith("pip install -e .") for line in installs), run
    assert any(line.startswith("echo ") and "runtime dependencies" in line for line in run), run
    assert run[-1] == ".venv/bin/python -m gateway serve --config config.yaml"
    # The tests (and .ci/run's `make .venv/bin/python`) still get the dev tools, over a runtime-only venv too.
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / ".venv" / "bin" / "python").symlink_to(shutil.which("python3") or "/usr/bin/python3")
    (tmp_path / ".venv" / ".runtime").touch()
    assert dry_run("run") == [run[-1]]
    dev = dry_run(".venv/bin/python")
    # The first `make test` says what it installs before pip starts, and pip's progress is shown, not -q.
    assert dev[0].startswith("echo ") and "dev tools" in dev[0], dev
    assert any("'.[dev]'" in line for line in dev) and not any(" -q" in line for line in dev), dev
    (tmp_path / ".venv" / ".dev").touch()
    assert dry_run("run") == [run[-1]]  # the dev install holds the runtime: nothing more to install
    test = dry_run("test")
    # What it does is said before pytest's collection (silent for seconds), and skip reasons are always listed.
    assert test[0].startswith("echo ") and test[-1] == ".venv/bin/python -m pytest -rs ", test


def test_serve_reads_the_env_file_beside_the_config_and_the_environment_wins(tmp_path: Path) -> None:
    path = _shipped(
        tmp_path,
        "# as .env.example: one VAR=value a line\n"
        "GATEWAY_ADMIN_KEY=from-the-file\n"
        'export OPENAI_API_KEY="sk-from-the-file"\n'
        "FIREWORKS_API_KEY=\n",
    )
    proc = GatewayProcess(path, _no_vllm(GATEWAY_ADMIN_KEY=ADMIN))
    try:
        proc.wait_ready()
        with httpx.Client(base_url=proc.url, trust_env=False, timeout=10) as client:
            assert client.get("/admin/status", headers={"authorization": "Bearer from-the-file"}).status_code == 401
            status = client.get("/admin/status", headers={"authorization": f"Bearer {ADMIN}"})
            assert status.status_code == 200
            providers = {p["name"]: p for p in status.json()["providers"]}
            assert providers["openai"]["available"] is True  # its key came from the file
            assert "FIREWORKS_API_KEY is not set" in providers["fireworks"]["reason"]  # empty counts as unset
    finally:
        proc.stop()
    log = proc.log.read_text()
    assert f"read 2 variable(s) from {tmp_path / '.env'}: OPENAI_API_KEY, FIREWORKS_API_KEY" in log
    assert "from-the-file" not in log  # names only, never values


def test_a_bad_env_file_is_one_line_naming_the_line_and_exit_1(tmp_path: Path) -> None:
    path = _shipped(tmp_path)
    bad = tmp_path / "keys.env"
    bad.write_text("OPENAI_API_KEY=sk-fine\nnot a secret-looking assignment sk-123\n")
    result = run_cli(["check-config", str(path), "--env-file", str(bad)])
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr.splitlines() == [
        f"env file error: {bad}:2: expected VAR=value, got 'not a secret-looking assignment sk-123'"
    ]


def test_without_an_admin_key_the_status_page_is_404_too(tmp_path: Path) -> None:
    proc = GatewayProcess(_shipped(tmp_path), _no_vllm())
    try:
        proc.wait_ready()
        with httpx.Client(base_url=proc.url, trust_env=False, timeout=10) as client:
            page = client.get("/")
            assert page.status_code == 404
            assert page.json()["error"]["type"] == "not_found_error"
            assert client.get("/admin/status").status_code == 404
    finally:
        proc.stop()
    assert "status page and /admin/* off (they answer 404)" in proc.log.read_text()


def _admin_status(url: str) -> dict[str, Any]:
    resp = httpx.get(url + "/admin/status", headers={"authorization": f"Bearer {ADMIN}"}, trust_env=False)
    assert resp.status_code == 200, resp.text
    data: dict[str, Any] = resp.json()
    return data


def test_what_cannot_be_called_is_unavailable_with_its_reason_and_not_listed(tmp_path: Path) -> None:
    proc = GatewayProcess(_shipped(tmp_path), _no_vllm(GATEWAY_ADMIN_KEY=ADMIN))
    try:
        proc.wait_ready()
        # The discovery finds nobody listening for `local` in the background, soon after start.
        wait_until(
            lambda: "local" in {p["name"] for p in _admin_status(proc.url)["providers"] if not p["available"]}, 20
        )
        status = _admin_status(proc.url)
        targets = {t["target"]: t for t in status["targets"]}
        fireworks = targets["fireworks/accounts/fireworks/models/llama-v3p1-8b-instruct"]
        assert fireworks["state"] == "unavailable"
        assert (
            fireworks["reason"]
            == "Provider 'fireworks' is unavailable: environment variable FIREWORKS_API_KEY is not set"
        )
        assert targets["openai/davinci-002"]["state"] == "unavailable"
        local = targets["local/meta-llama/Llama-3.1-8B"]
        assert local["state"] == "unavailable"
        assert local["reason"] == "Provider 'local' is unreachable: the connection was refused"
        assert {t["state"] for name, t in targets.items() if name.startswith("demo/")} == {"ok"}
        providers = {p["name"]: p for p in status["providers"]}
        assert providers["local"]["reason"] == local["reason"]

        models = httpx.get(proc.url + "/v1/models", trust_env=False).json()
        ids = [m["id"] for m in models["data"]]
        # `fast` (demo only) can be called; `llama-8b` (fireworks without key, vLLM not running) cannot.
        assert "fast" in ids and "demo/echo" in ids and "llama-8b" not in ids
        assert not [m for m in ids if m.split("/")[0] in ("openai", "fireworks", "local")], ids
    finally:
        proc.stop()


def test_start_up_prints_a_first_request_that_works(tmp_path: Path) -> None:
    proc = GatewayProcess(_shipped(tmp_path), _no_vllm())
    try:
        proc.wait_ready()
        found = re.search(
            r" INFO gateway\[\d+\]: try: curl -s (\S+) -H 'content-type: application/json' -d '(.+)'$",
            proc.log.read_text(),
            re.MULTILINE,
        )
        assert found, proc.log.read_text()
        url, body = found.group(1), json.loads(found.group(2))
        assert url == f"{proc.url}/v1/completions" and body["model"].startswith("demo/")
        resp = httpx.post(url, json=body, trust_env=False, timeout=10)
        assert resp.status_code == 200, resp.text
        assert resp.json()["choices"][0]["text"]
    finally:
        proc.stop()


def test_serve_help_explains_every_option_with_its_default() -> None:
    result = run_cli(["serve", "--help"])
    assert result.returncode == 0, result.stderr
    # argparse prints each option, then its help on the same line or the lines below it, up to the next option.
    options = re.split(r"\n  (?=-)", result.stdout.split("options:", 1)[1])[1:]
    helps = {o.split()[0].rstrip(","): " ".join(o.split()[1:]) for o in options}
    assert set(helps) == {"-h", "--config", "--host", "--port", "--workers", "--env-file", "--server", "--http"}, helps
    for option, text in helps.items():
        if option != "-h":
            assert "default" in text, f"{option} does not say its default: {text!r}"
    # README's synopsis names every option serve takes.
    synopsis = (REPO / "README.md").read_text().split("## Command line", 1)[1].split("```")[1]
    assert {o for o in helps if o != "-h"} <= set(re.findall(r"--[a-z-]+", synopsis)), synopsis
