"""Client and upstream text never meets a pattern that can backtrack on it.

Over real sockets: the gateway under uvicorn and a scripted loopback upstream.

- A client body with an unknown field whose name repeats " - at `$[" (msgspec quotes the name in its
  error message, which the dialects parse) cost the square of the name's length on Python's `re`
  (270 KB: 27 s of the event loop on the test machine). It is a 400 naming the field, at once.
- An upstream whose exhausted quota names its reset as 30,000 digits and no unit (within the
  64 KiB header cap) cost 89 s on Python's `re`. The answer is relayed at once, and the
  target is cooled for the reset the gateway falls back to when it cannot read one.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.helpers.faults import RECORDED_JSON, FaultServer, respond
from tests.helpers.servers import GatewayThread, serve_config

FAST_S = 3.0  # the time the fixed code needs is milliseconds; the old code's was 15 s and more


@pytest.fixture
def gw(faults: FaultServer, tmp_path: Path) -> Iterator[GatewayThread]:
    config = (
        "retries: {attempts: 1}\n"
        f"providers:\n  up: {{kind: openai, api_key: sk-up, base_url: '{faults['up'].base_url}'}}\n"
    )
    with serve_config(tmp_path, config) as served:
        yield served


def test_an_unknown_field_built_to_backtrack_is_refused_at_once(gw: GatewayThread, faults: FaultServer) -> None:
    name = " - at `$[" * 30_000
    body = json.dumps({"model": "up/davinci-002", "prompt": "hi", name: 1}).encode()
    with httpx.Client(trust_env=False, timeout=120) as c:
        t0 = time.monotonic()
        r = c.post(gw.url + "/v1/completions", content=body, headers={"content-type": "application/json"})
        elapsed = time.monotonic() - t0
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    # msgspec quotes the name between backticks: the part before the name's own first backtick is named.
    assert (error["code"], error["param"]) == ("unknown_parameter", name[: name.index("`")])
    assert elapsed < FAST_S, f"{elapsed:.1f} s to refuse one body"
    assert faults["up"].count == 0


def test_an_unreadable_quota_reset_costs_nothing(gw: GatewayThread, faults: FaultServer) -> None:
    headers = {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "1" * 30_000 + "q"}
    faults["up"].script(respond(RECORDED_JSON, headers=headers))
    body = {"model": "up/davinci-002", "prompt": "Say this is a test", "max_tokens": 7}
    with httpx.Client(trust_env=False, timeout=120) as c:
        t0 = time.monotonic()
        r = c.post(gw.url + "/v1/completions", json=body)
        elapsed = time.monotonic() - t0
        assert r.status_code == 200, r.text
        assert elapsed < FAST_S, f"{elapsed:.1f} s to read one answer's quota headers"
        # The counter is at zero and its reset unreadable: the target rests for the fallback second.
        again = c.post(gw.url + "/v1/completions", json=body)
    assert again.status_code == 429, again.text
    assert faults["up"].count == 1
