"""Shared setup of the same-target retry tests: target orders, the recorded vLLM 404, backoffs, providers."""

from __future__ import annotations

from tests.helpers.faults import FaultServer
from tests.helpers.pipelines import PROVIDERS
from tests.helpers.recordings import fixture_bytes

ORDERED_AB = """
  - name: smart
    strategy: ordered
    targets: [{model: alpha/davinci-002}]
    fallbacks: [beta/davinci-002]
"""
ONLY_A = """
  - name: smart
    targets: [{model: alpha/davinci-002}]
"""
# vLLM's answer to a model it does not serve (tests/fixtures/SOURCES.md: built from vLLM's source).
VLLM_404 = fixture_bytes("vllm/error_404_model_not_found.json")


def top(
    attempts: int = 3,
    *,
    budget_ms: int = 30000,
    same_target: int | None = None,
    first_byte_ms: int = 10000,
    total_ms: int = 60000,
) -> str:
    same = "" if same_target is None else f", same_target: {same_target}"
    return (
        f"retries: {{attempts: {attempts}, initial_backoff_ms: 250, max_backoff_ms: 8000, budget_ms: {budget_ms}"
        f"{same}}}\ncooldown: {{base_ms: 1000, max_ms: 60000, min_requests: 1}}\n"
        f"timeouts: {{connect_ms: 1000, first_byte_ms: {first_byte_ms}, total_ms: {total_ms}}}\n"
    )


def providers(faults: FaultServer, **extra: str) -> str:
    lines = ["providers:"]
    for name in PROVIDERS:
        more = extra.get(name, "")
        lines.append(f"  {name}: {{kind: openai, api_key: sk-{name}, base_url: {faults[name].base_url}{more}}}")
    return "\n".join(lines) + "\n"
