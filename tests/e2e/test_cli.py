"""`python -m gateway` as operators run it: check-config, serve, and the shipped config.yaml."""

from __future__ import annotations

import contextlib
import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from providers.registry import REGISTRY
from tests.helpers.errors import ALL_ROUTES, PAIS_ROUTE
from tests.helpers.recordings import REPO
from tests.helpers.servers import GatewayProcess, cli_env, free_port, run_cli
from tests.helpers.waiting import wait_until

BAD_CONFIGS = [
    pytest.param(
        "providers:\n  x: {kind: nope}\n",
        "providers.x.kind: Invalid enum value 'nope'; valid kinds: " + ", ".join(sorted(REGISTRY)),
        id="bad-kind",
    ),
    pytest.param('server: {port: "8080"}\n', "server.port: Expected `int`, got `str`", id="wrong-type"),
    pytest.param("server: {port: 70000}\n", "server.port: Expected `int` <= 65535", id="out-of-range"),
    pytest.param("providers: {}\nfoo: 1\n", "foo: unknown key", id="unknown-top-level-key"),
    pytest.param(
        "providers:\n  openai: {kind: openai, apikey: x}\n", "providers.openai.apikey: unknown key", id="unknown-key"
    ),
    pytest.param(
        "providers:\n  local: {kind: vllm}\n",
        "providers.local.base_url: required for kind 'vllm'",
        id="missing-base-url",
    ),
    pytest.param(
        "providers:\n  local: {kind: vllm, base_url: 'localhost:8000'}\n",
        "providers.local.base_url: must start with http:// or https://, got 'localhost:8000'",
        id="base-url-scheme",
    ),
    pytest.param(
        # httpx would send it as Basic auth instead of the key, h1 would drop it; and the URL is never echoed.
        "providers:\n  local: {kind: vllm, base_url: 'https://svc:hunter2-pw@vllm.internal/v1'}\n",
        "providers.local.base_url: must not carry credentials (user:password@); set api_key (or a headers: entry)",
        id="base-url-userinfo",
    ),
    pytest.param(
        "providers:\n  demo: {kind: fake}\nmodels:\n  - {name: a, targets: [{model: nope/x}]}\n",
        "models[0].targets[0].model: unknown provider 'nope' in 'nope/x'",
        id="alias-unknown-provider",
    ),
    pytest.param(
        "providers:\n  demo: {kind: fake}\nmodels:\n  - {name: a, targets: []}\n",
        "models[0].targets: Expected `array` of length >= 1",
        id="alias-without-targets",
    ),
    pytest.param(
        "keys:\n  - {name: a, key: k1}\n  - {name: a, key: k2}\n", "keys[1].name: duplicate key name 'a'", id="dup-key"
    ),
    pytest.param(
        # The password is never echoed: only the scheme.
        "ledger: {url: 'mongodb://admin:hunter2-pw@db.internal/ledger'}\n",
        "ledger.url: expected sqlite:///<path> or postgresql://..., got 'mongodb'",
        id="ledger-url-scheme",
    ),
    pytest.param(
        # A `/` in the password, not percent-encoded: the parser would take part of it for the host.
        "ledger: {url: 'postgresql://gw:hunter2/pw@db.internal:5432/ledger'}\n",
        "ledger.url: its user or password holds an unencoded '/', '?' or '#': percent-encode them (%2F, %3F, %23)",
        id="ledger-url-misplaced-password",
    ),
    pytest.param(
        "ledger: {url: 'sqlite:///'}\n",
        "ledger.url: sqlite:/// needs a file path (sqlite:///ledger.db, sqlite:////var/lib/gw/ledger.db)",
        id="ledger-url-no-path",
    ),
    pytest.param(
        "providers: [\n", "line 2, column 1: expected the node content, but found '<stream end>'", id="invalid-yaml"
    ),
    pytest.param("- just\n- a list\n", "(top level): expected a mapping, got list", id="not-a-mapping"),
]


def _one_line_error(result: Any, path: Path, where_problem: str) -> None:
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    assert result.stderr.splitlines() == [f"config error: {path}: {where_problem}"]


@pytest.mark.parametrize(("text", "where_problem"), BAD_CONFIGS)
def test_check_config_bad(tmp_path: Path, text: str, where_problem: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    _one_line_error(run_cli(["check-config", str(path)]), path, where_problem)


@pytest.mark.parametrize(
    ("text", "where_problem"), [p for p in BAD_CONFIGS if p.id in ("bad-kind", "missing-base-url", "ledger-url-scheme")]
)
def test_serve_with_bad_config_exits_1(tmp_path: Path, text: str, where_problem: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    _one_line_error(run_cli(["serve", "--config", str(path), "--port", "0"]), path, where_problem)


def test_check_config_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "absent.yaml"
    _one_line_error(run_cli(["check-config", str(path)]), path, "(file): No such file or directory")


STRICT = """
keys: [{name: ops, key: "${E2E_UNSET_OPS_KEY}"}]
providers:
  openai: {kind: openai, api_key: "${E2E_UNSET_OPENAI}"}
"""


def test_check_config_strict_fails_on_unset_variable(tmp_path: Path) -> None:
    path = tmp_path / "strict.yaml"
    path.write_text(STRICT)
    _one_line_error(
        run_cli(["check-config", "--strict", str(path)]),
        path,
        "keys[0].key: environment variable E2E_UNSET_OPS_KEY is not set",
    )


def test_check_config_without_strict_warns_and_passes(tmp_path: Path) -> None:
    path = tmp_path / "lenient.yaml"
    path.write_text(STRICT)
    result = run_cli(["check-config", str(path)])
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{path}: ok (1 providers, 0 aliases, 1 keys)\n"
    assert "client key 'ops' is disabled: its key variable is not set" in result.stderr
    assert "Provider 'openai' is unavailable: environment variable E2E_UNSET_OPENAI is not set" in result.stderr
    # The gateway is closed (a key is configured), so it must not claim to be open.
    assert "open to anyone" not in result.stderr


def test_check_config_strict_passes_when_variables_are_set(tmp_path: Path) -> None:
    path = tmp_path / "strict.yaml"
    path.write_text(STRICT)
    env = cli_env(E2E_UNSET_OPS_KEY="k", E2E_UNSET_OPENAI="sk")
    result = run_cli(["check-config", "--strict", str(path)], env=env)
    assert (result.returncode, result.stdout) == (0, f"{path}: ok (1 providers, 0 aliases, 1 keys)\n")
    assert "unavailable" not in result.stderr


def test_shipped_config_passes_check_config() -> None:
    result = run_cli(["check-config", "config.yaml"])
    assert (result.returncode, result.stdout) == (0, "config.yaml: ok (6 providers, 2 aliases, 0 keys)\n")
    assert "Traceback" not in result.stderr
    assert "no client keys configured: the gateway is open to anyone who can reach it" in result.stderr


def test_shipped_config_strict_names_the_first_unset_variable() -> None:
    result = run_cli(["check-config", "--strict", "config.yaml"])
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        "config error: config.yaml: providers.openai.api_key: environment variable OPENAI_API_KEY is not set"
    ]


# -- serving the shipped config as a child process -------------------------------------------------


@pytest.fixture(scope="module")
def shipped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    # A copy, so the log file lands in a temporary directory, not next to the shipped config.
    path = tmp_path_factory.mktemp("shipped") / "config.yaml"
    path.write_text((REPO / "config.yaml").read_text())
    # `local` (vLLM) points at a port nobody listens on, as on a laptop without vLLM.
    proc = GatewayProcess(path, cli_env(VLLM_BASE_URL=f"http://127.0.0.1:{free_port()}/v1"))
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()


def _expected_models(config: dict[str, Any], unreachable: set[str]) -> list[list[str]]:
    """GET /v1/models order: aliases, then alias targets, then each provider's advertised models; only what
    can be called (cli_env() unsets every `*_API_KEY`, so a provider whose api_key references one is left out,
    and so is one nobody listens for)."""
    down = {name for name, p in config["providers"].items() if "_API_KEY}" in str(p.get("api_key", ""))}
    down |= unreachable
    seen: dict[str, str] = {}
    for alias in config["models"]:
        if any(t["model"].split("/")[0] not in down for t in alias["targets"]):
            seen.setdefault(alias["name"], "gateway")
    for alias in config["models"]:
        for target in alias["targets"]:
            if target["model"].split("/")[0] not in down:
                seen.setdefault(target["model"], target["model"].split("/")[0])
    for name, provider in config["providers"].items():
        for model in provider.get("models", []) if name not in down else ():
            seen.setdefault(f"{name}/{model}", name)
    return [[k, v] for k, v in seen.items()]


def test_serve_shipped_config(shipped: GatewayProcess) -> None:
    with httpx.Client(base_url=shipped.url, trust_env=False, timeout=10) as client:
        assert client.get("/health").json() == {"status": "ok"}
        assert client.get("/ready").json() == {"status": "ready", "redis": "disabled"}

        # No keys configured: open, on every route, with the keyless fake provider.
        for route in ALL_ROUTES:
            resp = client.post(route, json={"model": "demo/echo", "prompt": "hello gateway", "n": 2})
            assert resp.status_code == 200, resp.text
            assert [c["text"] for c in resp.json()["choices"]] == ["hello gateway", "hello gateway"]

        shipped_yaml = yaml.safe_load((REPO / "config.yaml").read_text())
        expected = _expected_models(shipped_yaml, unreachable={"local"})

        def listed() -> list[list[str]]:
            return [[m["id"], m["owned_by"]] for m in client.get("/v1/models").json()["data"]]

        # The discovery finds nobody listening for `local` in the background, soon after start.
        with contextlib.suppress(AssertionError):
            wait_until(lambda: listed() == expected, timeout=10, interval=0.05)
        assert listed() == expected

        # OPENAI_API_KEY is unset: the provider fails fast naming the variable, nothing goes out.
        resp = client.post("/v1/completions", json={"model": "openai/gpt-3.5-turbo-instruct", "prompt": "x"})
        assert (resp.status_code, resp.json()["error"]["code"]) == (400, "provider_unavailable")
        assert resp.json()["error"]["message"] == (
            "Provider 'openai' is unavailable: environment variable OPENAI_API_KEY is not set"
        )
        resp = client.post(PAIS_ROUTE, json={"model": "together/m", "prompt": "x"})
        assert (resp.status_code, resp.json()) == (
            400,
            {
                "detail": "Invalid model endpoint specified or model endpoint not ready. "
                "Provider 'together' is unavailable: environment variable TOGETHER_API_KEY is not set"
            },
        )

        resp = client.post("/v1/completions", json={"model": "fast", "prompt": "x", "stream": True})
        assert resp.headers["content-type"].startswith("text/event-stream")
        assert resp.text.endswith("data: [DONE]\n\n")
        chunks = [json.loads(line[6:]) for line in resp.text.split("\n\n") if line and line != "data: [DONE]"]
        assert {c["model"] for c in chunks} == {"fast"}


@pytest.mark.parametrize(
    ("sig", "code"),
    [
        # uvicorn shuts down gracefully, then re-raises the signal so the exit status reports it.
        pytest.param(signal.SIGTERM, -signal.SIGTERM, id="sigterm"),
        # ...which for SIGINT is a KeyboardInterrupt that the CLI turns into a clean exit.
        pytest.param(signal.SIGINT, 0, id="sigint"),
    ],
)
def test_serve_logs_start_up_facts_and_stops_on_signal(tmp_path: Path, sig: signal.Signals, code: int) -> None:
    path = tmp_path / "config.yaml"
    path.write_text((REPO / "config.yaml").read_text())
    proc = GatewayProcess(path)
    try:
        proc.wait_ready()
        proc.proc.send_signal(sig)
        assert proc.proc.wait(10) == code
    finally:
        proc.stop()
    log = proc.log.read_text()
    assert "Traceback" not in log
    assert "no client keys configured: the gateway is open to anyone who can reach it" in log
    assert "Provider 'openai' is unavailable: environment variable OPENAI_API_KEY is not set" in log
    assert f"serving on http://127.0.0.1:{proc.port} with 1 worker(s)" in log
