"""`python -m bench.wings` runs: the shares of a request's CPU time by wing, over a few real requests.

The driver is bench.inprocess' (real ASGI app, real pipeline, a real loopback upstream for every path but the
fake ones: `h1`, `chat` and their streams).
"""

from __future__ import annotations

import pytest

from bench import wings


def test_the_shares_name_the_wings_and_add_up() -> None:
    cpu, places = wings.shares("h1", requests=40, warmup=5, chunks=3)
    shares = dict(places)
    assert cpu > 0
    assert abs(sum(shares.values()) - 1.0) < 1e-6
    # A completion through h1 runs the request path, the upstream client and an adapter.
    for wing in ("gateway/path", "gateway/upstream", "gateway/edge", "providers/"):
        assert shares.get(wing, 0.0) > 0.0, places


@pytest.mark.parametrize("path", ["chat", "chat-stream"])
def test_chat_paths_reach_the_loopback_upstream(path: str) -> None:
    cpu, places = wings.shares(path, requests=20, warmup=3, chunks=3)
    shares = dict(places)
    assert cpu > 0
    # The answer came from the upstream, through the upstream client and the openai adapter's chat route.
    for wing in ("gateway/path", "gateway/upstream", "providers/"):
        assert shares.get(wing, 0.0) > 0.0, places


def test_the_command_prints_one_block_per_path(capsys: pytest.CaptureFixture[str]) -> None:
    assert wings.main(["--paths", "fake", "--requests", "20", "--warmup", "5"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("fake: ") and "gateway/path" in out
