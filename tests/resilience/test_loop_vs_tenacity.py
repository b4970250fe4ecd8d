"""The failover loop against tenacity, over the same outcomes: same calls, same end, same waits.

`Run.go` (gateway/resilience/failover.py) replaced an `AsyncRetrying` loop (docs/architecture.md, "Retries:
tenacity or a loop"). Where tenacity can express the policy (one target, so "where" is always the same
target and the loop's turn is tenacity's attempt number), both are driven over one scripted sequence
of upstream outcomes: the real `Failover` with an injected clock and sleep, and an `AsyncRetrying`
built from tenacity's own strategies (`stop_after_attempt`, `wait_random_exponential`,
`retry_if_exception`, injected `sleep`), each from the same seeded `random`. The Retry-After wait is a
custom tenacity `wait` (the provider's wait, else the jitter). Left out: `retries.budget_ms` and the
request's deadline, since tenacity's `stop_before_delay` reads `time.monotonic`, not an injectable
clock (both are set out of reach here), and everything multi-target or hedged, which tenacity has no
notion of. Last, tenacity being only the reference now (a dev dependency), the gateway's packages
must import without it.
"""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
    wait_random_exponential,
)
from tenacity.wait import wait_base

from gateway.config import parse_config
from gateway.path.routing import Router
from gateway.resilience.failover import Failover
from gateway.resilience.health import Health
from gateway.state import SharedState
from gateway.upstream.plan import Plan
from tests.helpers.pipelines import VirtualTime
from wire.errors import (
    GatewayError,
    UpstreamConnectError,
    UpstreamStatusError,
    UpstreamTimeoutError,
    UpstreamUnreachableError,
)

REPO = Path(__file__).resolve().parents[2]

SEED = 20240603
# Out of reach of any run here (20 attempts x a Retry-After capped at 3600 s): tenacity cannot express them.
FAR_MS = 10**9


def plan(attempts: int, initial_ms: int, max_ms: int, same_target: int) -> Plan:
    """The one-target alias's compiled plan; the upstream is never called (the call is scripted)."""
    loaded = parse_config(
        "providers:\n"
        "  alpha: {kind: openai, api_key: sk-alpha, base_url: 'http://127.0.0.1:9/v1'}\n"
        f"retries: {{attempts: {attempts}, initial_backoff_ms: {initial_ms}, max_backoff_ms: {max_ms}, "
        f"budget_ms: {FAR_MS}, same_target: {same_target}}}\n"
        f"timeouts: {{total_ms: {FAR_MS}}}\n"
        "models:\n"
        "  - name: smart\n"
        "    targets: [{model: alpha/davinci-002}]\n",
        "loopdiff.yaml",
        env={},
    )
    return Router(loaded).plan("smart")


# One upstream outcome each: a fresh exception per call, since the loop writes `attempts` into it.
OUTCOMES: dict[str, Callable[[], GatewayError | None]] = {
    "ok": lambda: None,
    "503": lambda: UpstreamStatusError("overloaded", upstream_status=503, provider="alpha"),
    "500": lambda: UpstreamStatusError("failed", upstream_status=500, provider="alpha"),
    "529": lambda: UpstreamStatusError("overloaded", upstream_status=529, provider="alpha"),
    "504": lambda: UpstreamStatusError("gateway timeout", upstream_status=504, provider="alpha"),
    "429 after 2s": lambda: UpstreamStatusError("slow down", upstream_status=429, provider="alpha", retry_after=2.0),
    "503 after 0.15s": lambda: UpstreamStatusError("busy", upstream_status=503, provider="alpha", retry_after=0.15),
    "dropped": lambda: UpstreamConnectError("connection dropped"),
    "unreachable": lambda: UpstreamUnreachableError("connection refused"),
    "timeout": lambda: UpstreamTimeoutError("no first byte"),
    "400": lambda: UpstreamStatusError("bad request", upstream_status=400, provider="alpha"),
    "401": lambda: UpstreamStatusError("bad key", upstream_status=401, provider="alpha"),
    "quota": lambda: UpstreamStatusError("quota", upstream_status=429, provider="alpha", quota=True),
    "context": lambda: UpstreamStatusError("too long", upstream_status=400, provider="alpha", context_window=True),
}
RETRYABLE = [o for o in OUTCOMES if o != "ok" and OUTCOMES[o]().retryable]  # type: ignore[union-attr]
FINAL = [o for o in OUTCOMES if o == "ok" or not OUTCOMES[o]().retryable]  # type: ignore[union-attr]


@dataclass
class Script:
    """The upstream: the outcomes in order, the last one repeated for ever."""

    outcomes: Sequence[str]
    calls: int = 0
    seen: list[int] = field(default_factory=list)

    async def __call__(self, *_: Any) -> str:
        n = self.calls
        self.calls += 1
        await asyncio.sleep(0)
        exc = OUTCOMES[self.outcomes[min(n, len(self.outcomes) - 1)]]()
        if exc is None:
            return f"answer of call {n}"
        raise exc.evolve(message=f"call {n}: {exc.message}")


@dataclass
class Result:
    calls: int
    end: str  # the answer, or the error's class and message (which call it came from)
    sleeps: list[float]


def ended(calls: int, end: str, vtime: VirtualTime) -> Result:
    return Result(calls=calls, end=end, sleeps=vtime.sleeps)


def failure(exc: GatewayError) -> str:
    return f"{type(exc).__name__}: {exc.message}"


async def by_loop(outcomes: Sequence[str], attempts: int, initial_ms: int, max_ms: int, same_target: int) -> Result:
    random.seed(SEED)
    vtime = VirtualTime()
    health = Health(SharedState(""), parse_config("{}", "empty.yaml", env={}).config.cooldown, clock=vtime.clock)
    script = Script(outcomes)
    try:
        outcome = await Failover(health, sleep=vtime.sleep, clock=vtime.clock).run(
            plan(attempts, initial_ms, max_ms, same_target), script
        )
    except GatewayError as exc:
        assert exc.attempts == script.calls  # what `x-gateway-attempts` says is what happened
        return ended(script.calls, failure(exc), vtime)
    assert outcome.attempts == script.calls
    return ended(script.calls, outcome.value, vtime)


class wait_retry_after(wait_base):
    """The provider's Retry-After when the failure carries one, else `otherwise` (drawing nothing then)."""

    def __init__(self, otherwise: wait_base) -> None:
        self.otherwise = otherwise

    def __call__(self, retry_state: RetryCallState) -> float:
        assert retry_state.outcome is not None
        exc = retry_state.outcome.exception()
        after = exc.retry_after if isinstance(exc, GatewayError) else None
        return after if after is not None else self.otherwise(retry_state)


async def by_tenacity(outcomes: Sequence[str], attempts: int, initial_ms: int, max_ms: int) -> Result:
    random.seed(SEED)
    vtime = VirtualTime()
    script = Script(outcomes)
    retrying = AsyncRetrying(
        stop=stop_after_attempt(attempts),
        wait=wait_retry_after(wait_random_exponential(multiplier=initial_ms / 1000, max=max_ms / 1000)),
        # One target: only a failure a same-target retry may cure is retried; a timeout or an unreachable
        # target ends the request at once (nothing else is left to move on to).
        retry=retry_if_exception(lambda e: isinstance(e, GatewayError) and e.retryable and e.same_target),
        sleep=vtime.sleep,
        reraise=True,
    )
    try:
        value: str = await retrying(script)
    except GatewayError as exc:
        return ended(script.calls, failure(exc), vtime)
    return ended(script.calls, value, vtime)


async def compare(outcomes: Sequence[str], attempts: int, initial_ms: int = 250, max_ms: int = 8000) -> Result:
    want = await by_tenacity(outcomes, attempts, initial_ms, max_ms)
    # With one target, where the loop goes after its same-target retries is that target again, after
    # the same wait: how many there are must not change a thing.
    for same_target in (0, 1, 10):
        got = await by_loop(outcomes, attempts, initial_ms, max_ms, same_target)
        assert got == want, f"same_target={same_target}"
    return want


@pytest.mark.parametrize(
    ("outcomes", "attempts", "calls", "waits"),
    [
        pytest.param(["ok"], 3, 1, 0, id="first-attempt"),
        pytest.param(["503", "ok"], 3, 2, 1, id="one-503"),
        pytest.param(["503", "500", "529", "ok"], 4, 4, 3, id="5xx-burst-then-ok"),
        pytest.param(["503"], 4, 4, 3, id="always-503"),
        pytest.param(["dropped", "500", "529", "ok"], 6, 4, 3, id="mixed-transient"),
        pytest.param(["dropped", "timeout", "ok"], 6, 2, 1, id="timeout-ends-it"),
        pytest.param(["503", "unreachable", "ok"], 6, 2, 1, id="unreachable-ends-it"),
        pytest.param(["429 after 2s", "503 after 0.15s", "503", "ok"], 5, 4, 3, id="retry-after-then-jitter"),
        pytest.param(["503", "400"], 5, 2, 1, id="non-retryable-ends-it"),
        pytest.param(["quota"], 5, 1, 0, id="quota-not-retried"),
        pytest.param(["context"], 5, 1, 0, id="context-window-not-retried"),
        pytest.param(["500"], 1, 1, 0, id="attempts-1"),
        pytest.param(["500"] * 19 + ["ok"], 20, 20, 19, id="twenty-attempts-past-max-backoff"),
    ],
)
async def test_same_calls_end_and_waits(outcomes: list[str], attempts: int, calls: int, waits: int) -> None:
    result = await compare(outcomes, attempts)
    # Neither side ran trivially: the scripted sequence was followed as far as it was meant to be.
    assert result.calls == calls and len(result.sleeps) == waits


async def test_waits_are_full_jitter_and_retry_after() -> None:
    """The shared expectation, spelt out once: uniform(0, min(max, initial x 2^(n-1))) per turn n."""
    result = await compare(["503", "429 after 2s", "500", "500", "ok"], 5, initial_ms=1000, max_ms=3000)
    rng = random.Random(SEED)
    assert result.sleeps == [rng.uniform(0, 1.0), 2.0, rng.uniform(0, 3.0), rng.uniform(0, 3.0)]


@settings(max_examples=150, deadline=None)
@given(
    failures=st.lists(st.sampled_from(RETRYABLE), max_size=12),
    last=st.sampled_from(FINAL + RETRYABLE),
    attempts=st.integers(1, 20),
    initial_ms=st.integers(0, 5000),
    above_ms=st.integers(0, 15000),
)
def test_any_sequence(failures: list[str], last: str, attempts: int, initial_ms: int, above_ms: int) -> None:
    # The cap at or above the first backoff: a config with initial_backoff_ms above max_backoff_ms is refused.
    result = asyncio.run(compare([*failures, last], attempts, initial_ms, initial_ms + above_ms))
    assert result.calls <= attempts


# Every module of the two packages the image installs, imported with tenacity made unimportable.
WITHOUT_TENACITY = """
import importlib, pkgutil, sys
sys.modules["tenacity"] = None
for name in ("gateway", "providers"):
    package = importlib.import_module(name)
    for module in pkgutil.walk_packages(package.__path__, name + "."):
        importlib.import_module(module.name)
print("imported")
"""


def test_runtime_does_without_tenacity() -> None:
    """tenacity is a dev dependency (pyproject.toml): the gateway must not import it at run time."""
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_TENACITY], cwd=REPO, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0 and done.stdout.strip() == "imported", done.stderr[-2000:]
