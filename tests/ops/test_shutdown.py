"""Graceful shutdown, as `docker stop` drives it: SIGTERM to `python -m gateway serve`.

After SIGTERM the gateway must stop accepting connections at once, let every open stream run to its
`data: [DONE]`, then exit; a stream still running at `server.shutdown_grace_ms` is cut so the process
exits in time (before Docker's SIGKILL). Real child processes on loopback, fake provider streams
(`demo/drip-50ms`: 50 ms between tokens, so 20 tokens take about a second).
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from gateway.config import ConfigError, load_config
from tests.helpers.servers import GatewayChild, unshare_pid_works

STREAMS = 4
TOKENS = 20

CONFIG = """
server: {{host: 127.0.0.1, port: 0{grace}}}
providers:
  demo: {{kind: fake}}
"""


def _write_config(tmp_path: Path, grace_ms: int | None = None) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(CONFIG.format(grace="" if grace_ms is None else f", shutdown_grace_ms: {grace_ms}"))
    return path


@pytest.fixture
def gateway(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[GatewayChild]:
    pid1, grace_ms = request.param
    if pid1 and not unshare_pid_works():
        pytest.skip("cannot start a process as PID 1 of a new PID namespace here (unshare --pid)")
    child = GatewayChild(_write_config(tmp_path, grace_ms), pid1=pid1)
    try:
        child.wait_ready()
        yield child
    finally:
        child.stop()


@dataclass
class Stream:
    prompt: str
    data: list[str] = field(default_factory=list)
    first: asyncio.Event = field(default_factory=asyncio.Event)
    ended_at: float | None = None
    error: BaseException | None = None


async def _read(client: httpx.AsyncClient, url: str, stream: Stream, max_tokens: int, model: str) -> None:
    body = {"model": model, "prompt": stream.prompt, "max_tokens": max_tokens, "stream": True}
    try:
        async with client.stream("POST", url + "/v1/completions", json=body) as response:
            assert response.status_code == 200
            async for line in response.aiter_lines():
                if line.startswith("data: "):
                    stream.data.append(line[len("data: ") :])
                    stream.first.set()
    except httpx.TransportError as exc:
        stream.error = exc
    finally:
        stream.ended_at = time.monotonic()
        stream.first.set()


async def _long_prompts(client: httpx.AsyncClient, url: str, count: int, tokens: int) -> dict[str, str]:
    """`count` prompts whose fake completion runs to `tokens` tokens (finish_reason "length"), with their text.

    The fake provider's text depends on the prompt only, not on the model's behaviour suffix, so the
    undelayed `demo/text` answers what a `demo/drip-<N>ms` stream must deliver.
    """
    out: dict[str, str] = {}
    for i in range(500):
        prompt = f"drain me {i}"
        body = {"model": "demo/text", "prompt": prompt, "max_tokens": tokens}
        choice = (await client.post(url + "/v1/completions", json=body)).json()["choices"][0]
        if choice["finish_reason"] == "length":
            out[prompt] = choice["text"]
            if len(out) == count:
                return out
    raise AssertionError("the fake provider gave too few long completions")


async def _refused(port: int) -> bool:
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return True
    writer.close()
    return False


async def sigterm_mid_streams(gateway: GatewayChild, refuse_within_s: float, finish_within_s: float) -> float:
    """SIGTERM with STREAMS streams open mid-way: assert the listener closes within `refuse_within_s` while
    they run, and that every one then completes (all chunks, its finish reason, [DONE]). Returns when the
    signal was sent. Shared by the uvicorn and Granian shutdown tests."""
    async with httpx.AsyncClient(trust_env=False, timeout=15) as client:
        expected = await _long_prompts(client, gateway.url, STREAMS, TOKENS)
        streams = [Stream(prompt) for prompt in expected]
        readers = [asyncio.create_task(_read(client, gateway.url, s, TOKENS, "demo/drip-50ms")) for s in streams]
        await asyncio.wait_for(asyncio.gather(*(s.first.wait() for s in streams)), finish_within_s)
        assert all(s.ended_at is None for s in streams), "a stream ended before SIGTERM"
        before = [len(s.data) for s in streams]

        gateway.sigterm()
        sent = time.monotonic()

        # (a) The listener closes promptly, while every stream is still running.
        while not await _refused(gateway.port):
            assert time.monotonic() - sent < refuse_within_s, (
                f"still accepting connections {refuse_within_s} s after SIGTERM"
            )
            await asyncio.sleep(0.02)
        refused = time.monotonic()
        assert all(s.ended_at is None for s in streams), "a stream ended before the listener closed"

        # (b) Every open stream still completes: all its chunks, its finish reason, then [DONE].
        await asyncio.wait_for(asyncio.gather(*readers), finish_within_s)
    for stream, seen in zip(streams, before, strict=True):
        assert stream.error is None, f"{stream.prompt!r} broke: {stream.error!r}"
        assert stream.ended_at is not None and stream.ended_at > refused
        assert stream.data[-1] == "[DONE]"
        chunks = [json.loads(d) for d in stream.data[:-1]]
        assert not any("error" in c for c in chunks), chunks
        assert "".join(c["choices"][0]["text"] for c in chunks) == expected[stream.prompt]
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        assert len(stream.data) > seen + 1, "SIGTERM did not land mid-stream"
    return sent


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("gateway", "exit_status"),
    [
        # A plain child: uvicorn re-raises the SIGTERM once drained, so the status reports the signal.
        pytest.param((False, None), -signal.SIGTERM, id="child"),
        # PID 1, as in the container: the re-raised signal has no handler and is ignored, so exit 0.
        pytest.param((True, None), 0, id="pid1"),
    ],
    indirect=["gateway"],
)
async def test_sigterm_refuses_new_connections_and_drains_open_streams(gateway: GatewayChild, exit_status: int) -> None:
    sent = await sigterm_mid_streams(gateway, refuse_within_s=1.0, finish_within_s=10)

    # (c) Then the process exits by itself, well within the 30 s default grace.
    status = await asyncio.to_thread(gateway.proc.wait, 10)
    assert time.monotonic() - sent < 5
    assert status == exit_status
    log = gateway.log.read_text()
    assert "Traceback" not in log
    assert "graceful shutdown exceeded" not in log


@pytest.mark.timeout(30)
@pytest.mark.parametrize("gateway", [pytest.param((False, 1000), id="grace-1s")], indirect=True)
async def test_a_stream_longer_than_the_grace_deadline_is_cut_and_the_process_exits_in_time(
    gateway: GatewayChild,
) -> None:
    async with httpx.AsyncClient(trust_env=False, timeout=15) as client:
        # 30 tokens 200 ms apart: a 6 s stream.
        (prompt,) = await _long_prompts(client, gateway.url, 1, 30)
        stream = Stream(prompt)
        reader = asyncio.create_task(_read(client, gateway.url, stream, 30, "demo/drip-200ms"))
        await asyncio.wait_for(stream.first.wait(), 10)
        assert stream.ended_at is None
        gateway.sigterm()
        sent = time.monotonic()
        await asyncio.wait_for(reader, 10)
    status = await asyncio.to_thread(gateway.proc.wait, 10)
    # shutdown_grace_ms: 1000, then the lifespan shutdown: far less than the stream's 6 s.
    assert time.monotonic() - sent < 4
    assert status == -signal.SIGTERM
    assert stream.ended_at is not None and stream.ended_at - sent < 4
    # The client is told why its stream ends early, and sees it end: an error event, then [DONE].
    assert stream.error is None
    assert stream.data[-1] == "[DONE]"
    assert json.loads(stream.data[-2])["error"]["code"] == "shutdown_deadline_exceeded"
    assert len(stream.data) < 30
    log = gateway.log.read_text()
    assert "Cancel 1 running task(s), timeout graceful shutdown exceeded" in log
    # One WARNING line for the cut request, no ERROR and no traceback (it is the drain deadline doing its job).
    assert "Traceback" not in log and " ERROR " not in log, log
    lines = [json.loads(x) for x in log.splitlines() if x.startswith("{")]
    [access] = [x for x in lines if x["stream"]]
    [warning] = [x for x in log.splitlines() if access["request_id"] in x and not x.startswith("{")]
    assert " WARNING gateway" in warning and "drain deadline" in warning
    # Booked as what it is, not as a client that left (499 client_closed_request).
    assert (access["status"], access["error"]) == (503, "shutdown_deadline_exceeded")


def test_shutdown_grace_defaults_to_30_s_and_must_be_positive(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("providers: {demo: {kind: fake}}\n")
    assert load_config(path).config.server.shutdown_grace_ms == 30_000
    path.write_text("server: {shutdown_grace_ms: 0}\nproviders: {demo: {kind: fake}}\n")
    with pytest.raises(ConfigError, match=r"server\.shutdown_grace_ms: Expected `int` >= 1"):
        load_config(path)
