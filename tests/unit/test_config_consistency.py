"""gateway.config: settings each within their own bounds that contradict another, or name nothing defined, are
refused at load in one line naming the YAML path (gateway/config/consistency.py); what is left unset is not.
"""

from __future__ import annotations

import pytest

from gateway.config import ConfigError, parse_config

P = "providers: {x: {kind: fake}}\n"
AZ = "providers: {z: {kind: azure, deployments: {east: {base_url: 'https://east.example', api_key: k}}}}\n"


def error(text: str) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(text, "gw.yaml", {})
    message = str(info.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize(
    "text,expected",
    [
        # Not a number any setting means anything by; YAML reads an overflowing literal as .inf too.
        (
            P + "models: [{name: a, targets: [{model: x/y, weight: .inf}]}]",
            "models[0].targets[0].weight: must be a finite number, got .inf",
        ),
        (
            P + "models: [{name: a, targets: [{model: x/y, weight: .nan}]}]",
            "models[0].targets[0].weight: must be a finite number, got .nan",
        ),
        ("prices: {'x/*': {prompt_per_1m: .inf}}", "prices.x/*.prompt_per_1m: must be a finite number, got .inf"),
        (
            "prices: {'x/*': {completion_per_1m: 1.0e+400}}",
            "prices.x/*.completion_per_1m: must be a finite number, got .inf",
        ),
        ("keys: [{name: a, key: k, weight: .nan}]", "keys[0].weight: must be a finite number, got .nan"),
        ("teams: {t: {max_cost_per_day: .nan}}", "teams.t.max_cost_per_day: must be a finite number, got .nan"),
        ("cooldown: {failure_ratio: -.inf}", "cooldown.failure_ratio: must be a finite number, got -.inf"),
        ("queue: {low_share: .nan}", "queue.low_share: must be a finite number, got .nan"),
        (
            "providers: {v: {kind: vllm, replicas: [{url: 'http://a/v1'}], routing: {epsilon: .nan}}}",
            "providers.v.routing.epsilon: must be a finite number, got .nan",
        ),
        ("timeouts: {total_ms: .inf}", "timeouts.total_ms: must be a finite number, got .inf"),
        # References to names that are not defined, and empty names.
        (
            "keys: [{name: a, key: k, team: platfrom}]\nteams: {platform: {}}",
            "keys[0].team: no team 'platfrom' under teams: (declare it there; `{}` sets no budget)",
        ),
        (P + "models: [{name: '', targets: [{model: x/y}]}]", "models[0].name: an alias name may not be empty"),
        ("keys: [{name: ' ', key: k}]", "keys[0].name: a key name may not be empty"),
        ("teams: {'': {}}", "teams.: a team name may not be empty"),
        ("prices: {'': {prompt_per_1m: 1}}", "prices.: a price's model string (or glob) may not be empty"),
        (
            "providers: {z: {kind: azure, deployments: {'': {base_url: 'https://a'}}}}",
            "providers.z.deployments.: a deployment name may not be empty",
        ),
        (
            "providers: {z: {kind: azure, deployments: {east: {base_url: 'https://a', name: ''}}}}",
            "providers.z.deployments.east.name: may not be empty (unset: the deployment's key)",
        ),
        # A provider whose only URLs are its deployments' serves only strings ending in one of them.
        (
            AZ + "models: [{name: a, targets: [{model: z/gpt/west}]}]",
            "models[0].targets[0].model: 'z/gpt/west' names no deployment of provider 'z', which has no base_url of "
            "its own (east)",
        ),
        (
            AZ + "models: [{name: a, targets: [{model: z/gpt/east}], context_window_fallbacks: [z/gpt-long]}]",
            "models[0].context_window_fallbacks[0]: 'z/gpt-long' names no deployment of provider 'z', which has no "
            "base_url of its own (east)",
        ),
        # An alias that falls back to itself would only try its own targets again.
        (
            P + "models: [{name: a, targets: [{model: x/y}], fallbacks: [x/z, a]}]",
            "models[0].fallbacks[1]: a fallback cycle: alias 'a' falls back to itself",
        ),
        (
            P + "models: [{name: a, targets: [{model: x/y}], context_window_fallbacks: [a]}]",
            "models[0].context_window_fallbacks[0]: a fallback cycle: alias 'a' falls back to itself",
        ),
        # A lower setting written above the bound beside it.
        (
            "timeouts: {connect_ms: 10000, total_ms: 5000}",
            "timeouts.connect_ms: 10000 is above total_ms 5000, which bounds the whole call",
        ),
        (
            "timeouts: {first_byte_ms: 700000}",
            "timeouts.first_byte_ms: 700000 is above total_ms 600000, which bounds the whole call",
        ),
        (
            "providers: {x: {kind: fake, timeouts: {first_byte_ms: 20000, total_ms: 10000}}}",
            "providers.x.timeouts.first_byte_ms: 20000 is above total_ms 10000, which bounds the whole call",
        ),
        (
            "providers: {x: {kind: fake, timeouts: {stream_idle_ms: 20000, total_ms: 10000}}}",
            "providers.x.timeouts.stream_idle_ms: 20000 is above total_ms 10000, which bounds the whole call",
        ),
        (
            P + "models: [{name: a, targets: [{model: x/y}], timeouts: {connect_ms: 9000, total_ms: 8000}}]",
            "models[0].timeouts.connect_ms: 9000 is above total_ms 8000, which bounds the whole call",
        ),
        (
            "retries: {initial_backoff_ms: 10000, max_backoff_ms: 100}",
            "retries.initial_backoff_ms: 10000 is above max_backoff_ms 100",
        ),
        (
            P + "models: [{name: a, targets: [{model: x/y}], retries: {initial_backoff_ms: 9000}}]",
            "models[0].retries.initial_backoff_ms: 9000 is above max_backoff_ms 8000",
        ),
        ("cooldown: {base_ms: 30000, max_ms: 20000}", "cooldown.base_ms: 30000 is above max_ms 20000"),
        (
            "cache: {max_bytes: 1048576, max_entry_bytes: 4194304}",
            "cache.max_entry_bytes: 4194304 is above the memory store's bound cache.max_bytes 1048576",
        ),
        (
            "cache: {max_bytes: 1048576}\nproviders: {x: {kind: fake, cache: {max_entry_bytes: 2097152}}}",
            "providers.x.cache.max_entry_bytes: 2097152 is above the memory store's bound cache.max_bytes 1048576",
        ),
        (
            "ledger: {url: 'sqlite:///gw.db', batch_rows: 5000, queue_rows: 1000}",
            "ledger.batch_rows: 5000 is above queue_rows 1000: it is never reached",
        ),
        (
            "keys: [{name: a, key: k, max_cost_per_day: 50, max_cost_per_month: 20.5}]",
            "keys[0].max_cost_per_day: 50 is above max_cost_per_month 20.5: it is never reached",
        ),
        (
            "teams: {t: {max_cost_per_day: 2, max_cost_per_month: 1}}",
            "teams.t.max_cost_per_day: 2 is above max_cost_per_month 1: it is never reached",
        ),
        (
            P + "models: [{name: a, targets: [{model: x/y}], hedge_after_ms: 9000, timeouts: {total_ms: 8000}}]",
            "models[0].hedge_after_ms: 9000 is above total_ms 8000: no hedge would start",
        ),
        (
            "teams: {t: {priority: high, max_priority: normal}}",
            "teams.t.priority: 'high' is above the team's max_priority 'normal'",
        ),
    ],
)
def test_contradictions_are_refused_in_one_line_naming_the_path(text: str, expected: str) -> None:
    assert error(text) == f"gw.yaml: {expected}"


@pytest.mark.parametrize(
    "text",
    [
        # What is left unset is cut short by the bound written beside it, not refused: each block replaces the
        # one below it whole, so its unset keys take their defaults.
        "timeouts: {total_ms: 30000}",
        "providers: {x: {kind: fake, timeouts: {total_ms: 1000}}}",
        "retries: {max_backoff_ms: 100}",
        "cooldown: {max_ms: 500}",
        "cache: {mode: deterministic, max_bytes: 2048}",
        "ledger: {url: 'sqlite:///gw.db', queue_rows: 10}",
        # Equal is no contradiction.
        "timeouts: {connect_ms: 5000, first_byte_ms: 5000, total_ms: 5000}",
        # A stream that sends keep-alives may be given longer without progress than a silent one.
        "timeouts: {first_byte_ms: 5000, stream_idle_ms: 60000, total_ms: 60000}",
        "keys: [{name: a, key: k, max_cost_per_day: 5, max_cost_per_month: 5}]",
        # A Redis store's values are bounded by Redis, not by the memory store's max_bytes.
        "redis: {url: 'redis://127.0.0.1:6379'}\ncache: {store: redis, max_bytes: 1048576, max_entry_bytes: 8388608}",
        # A deployment named, or a provider URL for the strings that name none.
        AZ + "models: [{name: a, targets: [{model: z/gpt/east}]}]",
        AZ.replace("{kind: azure,", "{kind: azure, base_url: 'https://z.example',")
        + "models: [{name: a, targets: [{model: z/gpt/west}]}]",
        # A team declared with no settings only groups its keys.
        "keys: [{name: a, key: k, team: t}]\nteams: {t: {}}",
        # Fallbacks are one level deep (a fallback alias's own fallbacks are not followed): two aliases may back
        # each other up.
        P + "models: [{name: a, targets: [{model: x/y}], fallbacks: [b]}, {name: b, targets: [{model: x/z}], "
        "fallbacks: [a]}]",
    ],
)
def test_consistent_settings_load(text: str) -> None:
    parse_config(text, "gw.yaml", {})


def test_a_yaml_syntax_error_names_its_line_and_column() -> None:
    assert error("server:\n  port: 8080\n  host: [a, b\n") == (
        "gw.yaml: line 4, column 1: expected ',' or ']', but got '<stream end>'"
    )
    assert error("server: {port: 1}\nlogging: requests: true\n") == (
        "gw.yaml: line 2, column 18: mapping values are not allowed here"
    )
