"""The queue's config: bad values fail at start-up with one line naming the YAML path."""

from __future__ import annotations

import pytest

from gateway.config import ConfigError, parse_config

BASE = """
providers:
  engine: {kind: vllm, base_url: "http://127.0.0.1:9/v1", discover: false, max_concurrency: 4}
"""


@pytest.mark.parametrize(
    ("text", "where"),
    [
        (
            "keys: [{name: a, key: k, priority: high}]",
            "keys[0].priority: 'high' is above the key's max_priority 'normal'",
        ),
        ("teams: {t: {priority: high}}\nkeys: [{name: a, key: k, team: t}]", "keys[0].priority: 'high' is above"),
        ("keys: [{name: a, key: k, weight: 0}]", "keys[0].weight"),
        ("queue: {max_depth: 0}", "queue.max_depth"),
        ("queue: {fair_by: org}", "queue.fair_by"),
        ("queue: {max_wait_by_priority: {urgent: 5}}", "queue.max_wait_by_priority"),
        ("providers: {engine: {kind: vllm, base_url: 'http://h/v1', max_concurrency: 0}}", "providers.engine"),
        (
            "providers: {engine: {kind: vllm, replicas: [{url: 'http://h/v1', max_concurrency: -1}]}}",
            "providers.engine.replicas",
        ),
    ],
)
def test_a_bad_queue_setting_is_one_line_naming_it(text: str, where: str) -> None:
    source = text if text.startswith("providers") else BASE + text
    with pytest.raises(ConfigError) as err:
        parse_config(source)
    assert where in str(err.value)
    assert "\n" not in str(err.value)


def test_a_team_may_allow_its_keys_a_higher_priority() -> None:
    loaded = parse_config(BASE + "teams: {t: {max_priority: high, priority: high}}\nkeys: [{name: a, key: k, team: t}]")
    assert loaded.config.teams["t"].max_priority == "high"
