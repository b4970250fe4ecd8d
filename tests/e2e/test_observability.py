"""Metrics, request ids, access log lines, and live config reload, over real sockets."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.helpers.accesslog import Lines
from tests.helpers.recordings import REPO
from tests.helpers.servers import GatewayProcess, GatewayThread, cli_env, free_port, rewrite

# Declared models are labelled by name; any other demo/<name> would be counted as demo/other.
BASE = """
providers:
  demo: {kind: fake, models: [text, long]}
models:
  - {name: fast, targets: [{model: demo/text}]}
"""


def metric(text: str, name: str, **labels: str) -> float:
    """The value of one sample in a Prometheus text exposition (0 when absent)."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        m = re.match(r"^([^{ ]+)(?:\{(.*)\})? (\S+)$", line)
        assert m is not None, line
        got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        if all(got.get(k) == v for k, v in labels.items()):
            total += float(m.group(3))
    return total


@pytest.fixture
def gw(tmp_path: Path) -> Iterator[GatewayThread]:
    path = tmp_path / "config.yaml"
    path.write_text(BASE)
    with GatewayThread(path, {}) as g:
        yield g


def test_metrics_after_a_known_sequence(gw: GatewayThread) -> None:
    with httpx.Client(base_url=gw.url, trust_env=False, timeout=10) as c:
        for _ in range(3):
            assert (
                c.post("/v1/completions", json={"model": "demo/long", "prompt": "a b", "max_tokens": 4}).status_code
                == 200
            )
        assert c.post("/v1/completions", json={"model": "nope/x", "prompt": "a"}).status_code == 404
        assert c.post("/v1/completions", json={"model": "fast", "prompt": "a", "max_tokens": 2}).status_code == 200
        resp = c.get("/metrics")
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/plain")
    text = resp.text
    assert metric(text, "gateway_requests_total", model="demo/long", provider="demo", status="200") == 3
    assert metric(text, "gateway_requests_total", model="unknown", provider="none", status="404") == 1
    assert metric(text, "gateway_requests_total", model="fast", provider="demo", status="200") == 1
    # demo/long: 2 prompt words and exactly max_tokens completion tokens, three times.
    assert metric(text, "gateway_tokens_total", kind="prompt", model="demo/long") == 6
    assert metric(text, "gateway_tokens_total", kind="completion", model="demo/long") == 12
    assert metric(text, "gateway_request_duration_seconds_count", dialect="openai") == 5
    assert metric(text, "gateway_overhead_seconds_count") == 4
    assert metric(text, "gateway_in_flight") == 0


def test_request_id_is_honoured_or_made_and_logged(gw: GatewayThread, access: Lines) -> None:
    with httpx.Client(base_url=gw.url, trust_env=False, timeout=10) as c:
        mine = c.post(
            "/v1/completions",
            json={"model": "demo/long", "prompt": "one two three", "max_tokens": 2},
            headers={"x-request-id": "trace-42.a"},
        )
        made = c.post(
            "/v1/completions", json={"model": "demo/text", "prompt": "x"}, headers={"x-request-id": "bad id!"}
        )
        failed = c.post("/v1/completions", json={"model": "demo/error-500", "prompt": "x"})
    assert mine.headers["x-request-id"] == "trace-42.a"
    assert re.fullmatch(r"req_[0-9a-f]{24}", made.headers["x-request-id"])
    assert re.fullmatch(r"req_[0-9a-f]{24}", failed.headers["x-request-id"])
    deadline = time.monotonic() + 2
    while len(access.lines) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    first, _, third = access.lines
    assert {k: first[k] for k in ("request_id", "dialect", "model", "provider", "status", "attempts")} == {
        "request_id": "trace-42.a",
        "dialect": "openai",
        "model": "demo/long",
        "provider": "demo",
        "status": 200,
        "attempts": 1,
    }
    assert (first["prompt_tokens"], first["completion_tokens"], first["stream"]) == (3, 2, False)
    assert "prompt" not in first and "completion" not in first  # prompt logging is off by default
    assert (third["status"], third["error"], third["request_id"]) == (
        502,
        "upstream_http_500",
        failed.headers["x-request-id"],
    )


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`serve --workers 2` on the base config: its URL. One for the module: its tests count apart (requests of
    `demo/text`, streams in flight at the time)."""
    path = tmp_path_factory.mktemp("two-workers") / "config.yaml"
    path.write_text(BASE)
    port = free_port()
    env = cli_env()
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway", "serve", "--config", str(path), "--port", str(port), "--workers", "2"],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                if httpx.get(url + "/health", trust_env=False, timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the gateway did not start"
            time.sleep(0.1)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(15)


def _scrape(url: str) -> str:
    # A connection of its own, so the kernel may hand it to either worker.
    with httpx.Client(trust_env=False, timeout=10) as c:
        return c.get(url + "/metrics").text


def test_metrics_add_up_across_workers(two_workers: str) -> None:
    url = two_workers
    # Separate connections, so the kernel spreads them over both workers.
    for _ in range(20):
        with httpx.Client(trust_env=False, timeout=10) as c:
            assert c.post(url + "/v1/completions", json={"model": "demo/text", "prompt": "x"}).status_code == 200
    # Whichever worker answers /metrics, it reports all 20: an idle worker has written what it counted.
    for _ in range(6):
        assert metric(_scrape(url), "gateway_requests_total", model="demo/text", status="200") == 20


def test_in_flight_across_workers_counts_an_open_stream_then_nothing(two_workers: str) -> None:
    url = two_workers
    body = {"model": "demo/drip-300ms", "prompt": "x", "max_tokens": 8, "stream": True}
    with httpx.Client(trust_env=False, timeout=20) as c, c.stream("POST", url + "/v1/completions", json=body) as s:
        chunks = s.iter_raw()  # one iterator: a dropped one closes the stream
        next(chunks)
        # The worker serving the stream wrote its 1 when the stream started, whichever worker is scraped.
        for _ in range(6):
            assert metric(_scrape(url), "gateway_in_flight") == 1
        for _ in chunks:
            pass
    for _ in range(6):
        assert metric(_scrape(url), "gateway_in_flight") == 0


def _wait_for(check: object, timeout: float = 6.0) -> None:
    assert callable(check)
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


def test_changed_file_reloads_and_in_flight_stream_finishes_on_the_old_config(
    gw: GatewayThread, tmp_path: Path
) -> None:
    path = tmp_path / "config.yaml"
    with httpx.Client(base_url=gw.url, trust_env=False, timeout=20) as c:
        assert c.post("/v1/completions", json={"model": "smart", "prompt": "x"}).status_code == 404
        with c.stream(
            "POST",
            "/v1/completions",
            json={"model": "demo/drip-300ms", "prompt": "x", "max_tokens": 60, "stream": True},
        ) as streaming:
            raw = streaming.iter_raw()
            first = next(raw)
            path.write_text(BASE + "  - {name: smart, targets: [{model: demo/echo}]}\n")
            _wait_for(lambda: c.post("/v1/completions", json={"model": "smart", "prompt": "hi"}).status_code == 200)
            reloaded_at = time.monotonic()
            rest = b"".join(raw)
            ended_at = time.monotonic()
        body = (first + rest).decode()
    # At least 8 tokens 300 ms apart outlast the 2 s poll: the stream really straddled the reload.
    assert ended_at - reloaded_at > 0.1
    # The stream that started before the reload ran to its end: the whole (deterministic) answer, then [DONE].
    events = [e for e in body.split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    streamed = "".join(json.loads(e[len("data: ") :])["choices"][0]["text"] for e in events[:-1])
    with httpx.Client(base_url=gw.url, trust_env=False, timeout=20) as c:
        whole = c.post("/v1/completions", json={"model": "demo/drip-300ms", "prompt": "x", "max_tokens": 60}).json()
    assert streamed == whole["choices"][0]["text"] and len(events) > 10


def test_invalid_new_config_keeps_the_old_one(
    gw: GatewayThread, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "config.yaml"
    with caplog.at_level(logging.ERROR, logger="gateway"):
        path.write_text(BASE.replace("kind: fake", "kind: opnai"))
        _wait_for(lambda: any("config reload" in r.getMessage() for r in caplog.records))
    message = next(r.getMessage() for r in caplog.records if "config reload" in r.getMessage())
    assert "providers.demo.kind" in message and "\n" not in message
    with httpx.Client(base_url=gw.url, trust_env=False, timeout=10) as c:
        assert c.post("/v1/completions", json={"model": "fast", "prompt": "x"}).status_code == 200


def test_reload_under_load_fails_no_request(gw: GatewayThread, tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    failures: list[int] = []
    sent = 0
    stop = threading.Event()

    def load() -> None:
        nonlocal sent
        with httpx.Client(base_url=gw.url, trust_env=False, timeout=10) as c:
            while not stop.is_set():
                r = c.post("/v1/completions", json={"model": "fast", "prompt": "x", "max_tokens": 3})
                sent += 1
                if r.status_code != 200:
                    failures.append(r.status_code)

    workers = [threading.Thread(target=load) for _ in range(3)]
    gw.poll_config_often()
    for w in workers:
        w.start()
    try:
        for i in range(3):
            target = "demo/echo" if i % 2 == 0 else "demo/text"
            rewrite(path, BASE.replace("demo/text}", f"{target}}}"))
            before = gw.app.state.reloader.reloads
            _wait_for(lambda b=before: gw.app.state.reloader.reloads > b)
    finally:
        stop.set()
        for w in workers:
            w.join(10)
    assert sent > 50
    assert failures == []


def test_sighup_reloads_at_once(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(BASE)
    gw = GatewayProcess(path)
    try:
        gw.wait_ready()
        with httpx.Client(base_url=gw.url, trust_env=False, timeout=10) as c:
            assert c.post("/v1/completions", json={"model": "smart", "prompt": "x"}).status_code == 404
            # Same size and mtime as far as a 2 s poll could tell: only the signal can explain a reload.
            path.write_text(BASE + "  - {name: smart, targets: [{model: demo/echo}]}\n")
            gw.proc.send_signal(signal.SIGHUP)
            _wait_for(
                lambda: c.post("/v1/completions", json={"model": "smart", "prompt": "hi"}).status_code == 200, 1.5
            )
    finally:
        gw.stop()
