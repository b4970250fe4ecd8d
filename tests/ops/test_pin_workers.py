"""`server.pin_workers`: `serve` as a child process, each worker and its threads on a core of its own.

Where each worker and thread may run is read from /proc (`Cpus_allowed_list`), with the ledger on so that a
worker has its writer's thread to inherit the core.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.helpers.servers import GatewayProcess, answering_workers, cli_env, spawned_workers
from tests.helpers.upstreams import Upstream, reply

ANSWER = (
    b'{"id": "c", "object": "text_completion", "created": 1, "model": "m", "choices": [{"index": 0, '
    b'"text": "ok", "finish_reason": "stop"}], '
    b'"usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}'
)
BODY = b'{"model": "up/m", "prompt": "hi", "max_tokens": 1}'
CORES = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []

pytestmark = pytest.mark.skipif(len(CORES) < 2 or not Path("/proc/self/task").is_dir(), reason="needs Linux, 2 cores")


def _config(tmp_path: Path, upstream: Upstream, workers: int) -> Path:
    path = tmp_path / "pinned.yaml"
    path.write_text(
        f"server: {{workers: {workers}, pin_workers: true}}\n"
        "logging: {requests: false}\n"
        f"ledger: {{url: 'sqlite:///{tmp_path / 'ledger.db'}', flush_ms: 10}}\n"
        f"providers:\n  up: {{kind: vllm, base_url: {upstream.url}/v1, discover: false}}\n"
    )
    return path


def _allowed(pid: int, tid: int) -> str:
    for line in Path(f"/proc/{pid}/task/{tid}/status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return line.split(":", 1)[1].strip()
    raise AssertionError(f"no Cpus_allowed_list for {pid}/{tid}")


def _threads(pid: int) -> dict[int, str]:
    """Each thread of `pid` and the cores it may run on."""
    return {int(tid): _allowed(pid, int(tid)) for tid in os.listdir(f"/proc/{pid}/task")}


def _settled(main_pid: int, workers: int, timeout: float = 10) -> dict[int, dict[int, str]]:
    """Each worker's threads once every worker runs its ledger writer beside its loop (more than one thread)."""
    deadline = time.monotonic() + timeout
    while True:
        found = {pid: _threads(pid) for pid in spawned_workers(main_pid)}
        if len(found) == workers and all(len(threads) > 1 for threads in found.values()):
            return found
        assert time.monotonic() < deadline, found
        time.sleep(0.05)


def test_each_worker_and_its_threads_hold_a_core_of_their_own_and_a_replacement_takes_the_freed_one(
    tmp_path: Path,
) -> None:
    with Upstream() as upstream:
        upstream.handler = reply(ANSWER)
        gw = GatewayProcess(_config(tmp_path, upstream, 2), cli_env())
        try:
            gw.wait_ready()
            answering_workers(gw.url, BODY, 2)
            before = _settled(gw.proc.pid, 2)
            cores = {pid: set(threads.values()) for pid, threads in before.items()}
            # One core per worker, the same for every thread it has (the writer's included), none shared.
            assert all(len(c) == 1 for c in cores.values()), before
            assert sorted(c.pop() for c in cores.values()) == [str(c) for c in CORES[:2]], before

            killed = min(before)
            freed = next(iter(before[killed].values()))
            os.kill(killed, signal.SIGKILL)
            deadline = time.monotonic() + 30
            while killed in spawned_workers(gw.proc.pid) or len(spawned_workers(gw.proc.pid)) < 2:
                assert time.monotonic() < deadline, gw.log.read_text()[-2000:]
                time.sleep(0.05)
            answering_workers(gw.url, BODY, 2)
            after = _settled(gw.proc.pid, 2)
            (new,) = set(after) - set(before)
            assert set(after[new].values()) == {freed}, after
        finally:
            gw.stop()


def test_a_worker_that_finds_every_core_held_runs_unpinned_and_says_so(tmp_path: Path) -> None:
    with Upstream() as upstream:
        upstream.handler = reply(ANSWER)
        gw = GatewayProcess(_config(tmp_path, upstream, len(CORES) + 1), cli_env())
        try:
            gw.wait_ready()
            answering_workers(gw.url, BODY, len(CORES) + 1)
            found = _settled(gw.proc.pid, len(CORES) + 1)
        finally:
            gw.stop()
        log = gw.log.read_text()
    everywhere = _allowed(os.getpid(), os.getpid())
    places = sorted(set(threads.values()).pop() for threads in found.values())
    assert places.count(everywhere) == 1, found
    assert sorted(p for p in places if p != everywhere) == [str(c) for c in CORES], found
    assert log.count(f"server.pin_workers: every one of the {len(CORES)} cores this process may use is held") == 1
