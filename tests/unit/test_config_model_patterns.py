"""gateway.config: a model pattern the operator writes (`keys[].models`, `teams.<name>.models`, a `prices:` key)
that no string the config routes could match is refused at load in one line naming it; one that routes but
matches none of the models its providers list, when those lists are all there is, is a WARNING
(gateway/config/patterns.py)."""

from __future__ import annotations

import logging

import pytest

from gateway.config import ConfigError, parse_config

# `openai` lists its models and asks its upstream for none (a hosted catalog: discovery off by default);
# `llama` is a self-hosted server with two replicas whose models the gateway asks it for.
P = (
    "providers:\n"
    "  openai: {kind: openai, api_key: k, models: [gpt-4o, gpt-4o-mini]}\n"
    "  llama: {kind: vllm, replicas: ['http://127.0.0.1:9/v1', 'http://127.0.0.1:10/v1']}\n"
    "models: [{name: fast, targets: [{model: openai/gpt-4o-mini}]}]\n"
)
KNOWN = "(providers: openai, llama)"


def error(text: str) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(text, "gw.yaml", {})
    message = str(info.value)
    assert "\n" not in message
    return message


def key(*models: str) -> str:
    return P + f"keys: [{{name: a, key: k, models: {list(models)}}}]\n"


@pytest.mark.parametrize(
    "text,expected",
    [
        (
            key("openai/*", "lama/*"),
            f"keys[0].models[1]: the key could never call it: 'lama/*' names no provider 'lama' {KNOWN} and no alias",
        ),
        (
            key("gpt-4o"),
            "keys[0].models[0]: the key could never call it: 'gpt-4o' is neither an alias nor <provider>/<model>",
        ),
        (
            key("lama/gpt-4o"),
            f"keys[0].models[0]: the key could never call it: 'lama/gpt-4o' names no provider 'lama' {KNOWN} and no "
            "alias",
        ),
        (
            key("gpt-*"),
            "keys[0].models[0]: the key could never call it: 'gpt-*' matches no alias and no <provider>/<model> "
            + KNOWN,
        ),
        (
            key("openai/"),
            "keys[0].models[0]: the key could never call it: 'openai/' names no model of provider 'openai'",
        ),
        (
            # A key's `*` stops at `/`: it matches the alias names only, and this config has none without `/`.
            P.replace("name: fast", "name: team/fast") + "keys: [{name: a, key: k, models: ['*']}]\n",
            f"keys[0].models[0]: the key could never call it: '*' matches no alias and no <provider>/<model> {KNOWN}",
        ),
        (
            P + "prices: {'lama/*': {prompt_per_1m: 1}}",
            f"prices.lama/*: never applies: 'lama/*' names no provider 'lama' {KNOWN} and no alias",
        ),
        (
            P + "prices: {gpt-4o: {prompt_per_1m: 1}}",
            "prices.gpt-4o: never applies: 'gpt-4o' is neither an alias nor <provider>/<model>",
        ),
        (
            P + "prices: {'llama@2/*': {prompt_per_1m: 1}}",  # replicas are llama@0 and llama@1
            f"prices.llama@2/*: never applies: 'llama@2/*' names no provider 'llama@2' {KNOWN} and no alias",
        ),
        (
            P + "teams: {blue: {}, red: {models: [fast, 'lama/*']}}",
            f"teams.red.models[1]: the team could never call it: 'lama/*' names no provider 'lama' {KNOWN} and no "
            "alias",
        ),
        (
            P + "teams: {red: {models: [gpt-4o]}}",
            "teams.red.models[0]: the team could never call it: 'gpt-4o' is neither an alias nor <provider>/<model>",
        ),
    ],
)
def test_a_pattern_no_routed_model_can_match_is_refused(text: str, expected: str) -> None:
    assert error(text) == f"gw.yaml: {expected}"


@pytest.mark.parametrize(
    "text",
    [
        key("**", "*", "fast", "openai/*", "llama/**", "l*/x", "llama/any-model", "?ast"),
        P + "teams: {blue: {models: ['**', fast, 'openai/*', 'llama/**']}, none: {models: []}}",
        # Prices are fnmatch globs (`*` crosses `/`, `[...]` is a class) and also see replica targets.
        P + "prices: {'*': {}, 'llama@1/*': {}, '[lo]*/x': {}, 'open?i/gpt-4o': {}, fast: {}, 'llama/m': {}}",
        # A config that declares no provider routes nothing: its keys' patterns are not held to it.
        "keys: [{name: a, key: k, models: ['openai/*', gpt-4o]}]\nprices: {'x/*': {}}",
    ],
)
def test_patterns_that_can_match_a_routed_model_load(text: str, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="gateway"):
        parse_config(text, "gw.yaml", {})
    assert caplog.messages == []


def test_a_pattern_matching_none_of_a_listed_providers_models_is_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="gateway"):
        text = key("openai/gpt-4o-mnii", "openai/gpt-5*") + "prices: {openai/gpt-4o-mnii: {}}\n"
        parse_config(text + "teams: {blue: {models: [fast, openai/gpt-4o-mnii]}}", "gw.yaml", {})
    why = "matches no alias and none of the models providers.openai.models lists (requests for it still go upstream)"
    assert caplog.messages == [
        f"gw.yaml: keys[0].models[0]: 'openai/gpt-4o-mnii' {why}",
        f"gw.yaml: keys[0].models[1]: 'openai/gpt-5*' {why}",
        f"gw.yaml: teams.blue.models[1]: 'openai/gpt-4o-mnii' {why}",
        f"gw.yaml: prices.openai/gpt-4o-mnii: 'openai/gpt-4o-mnii' {why}",
    ]


@pytest.mark.parametrize(
    "provider",
    [
        # Its models can appear at run time: the discovery asks the upstream (on by default for vLLM).
        "llama: {kind: vllm, base_url: 'http://127.0.0.1:9/v1', models: [m]}",
        "llama: {kind: openai, api_key: k, discover: true, models: [m]}",
        # It lists nothing: any model may be meant.
        "llama: {kind: openai, api_key: k}",
    ],
)
def test_no_warning_when_a_providers_models_are_not_all_listed(provider: str, caplog: pytest.LogCaptureFixture) -> None:
    text = f"providers: {{{provider}}}\nkeys: [{{name: a, key: k, models: [llama/other]}}]\n"
    with caplog.at_level(logging.WARNING, logger="gateway"):
        parse_config(text, "gw.yaml", {})
    assert caplog.messages == []


def test_a_price_of_a_listed_model_on_one_replica_is_no_warning(caplog: pytest.LogCaptureFixture) -> None:
    text = (
        "providers:\n  llama: {kind: vllm, discover: false, models: [m],"
        " replicas: ['http://127.0.0.1:9/v1', 'http://127.0.0.1:10/v1']}\n"
        "prices: {'llama@1/m': {prompt_per_1m: 1}, 'llama@0/n': {prompt_per_1m: 1}}\n"
    )
    with caplog.at_level(logging.WARNING, logger="gateway"):
        parse_config(text, "gw.yaml", {})
    assert caplog.messages == [
        "gw.yaml: prices.llama@0/n: 'llama@0/n' matches no alias and none of the models providers.llama.models "
        "lists (requests for it still go upstream)"
    ]


def test_discovery_switched_off_leaves_the_listed_models_all_there_is(caplog: pytest.LogCaptureFixture) -> None:
    text = (
        "discovery: {enabled: false}\n"
        "providers: {llama: {kind: vllm, base_url: 'http://127.0.0.1:9/v1', models: [m]}}\n"
        "keys: [{name: a, key: k, models: [llama/other, llama/m]}]\n"
    )
    with caplog.at_level(logging.WARNING, logger="gateway"):
        parse_config(text, "gw.yaml", {})
    assert caplog.messages == [
        "gw.yaml: keys[0].models[0]: 'llama/other' matches no alias and none of the models providers.llama.models "
        "lists (requests for it still go upstream)"
    ]
