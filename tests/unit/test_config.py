"""gateway.config: ${VAR} interpolation, missing variables, one-line errors naming the YAML path, strict mode."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config import ConfigError, load_config, parse_config
from gateway.path.routing import Router
from providers.registry import REGISTRY


def error(text: str, env: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(text, "gw.yaml", env or {})
    message = str(info.value)
    assert "\n" not in message
    return message


def test_defaults_from_an_empty_file() -> None:
    loaded = parse_config("", env={})
    cfg = loaded.config
    assert (cfg.server.host, cfg.server.port, cfg.server.workers) == ("127.0.0.1", 8080, 1)
    assert cfg.unsupported_params == "error"
    assert (cfg.timeouts.connect_ms, cfg.timeouts.first_byte_ms, cfg.timeouts.total_ms) == (5000, 120000, 600000)
    assert loaded.providers == {} and loaded.missing_env == {}


def test_var_and_default_interpolation() -> None:
    text = """
redis: {url: "${REDIS_URL:-redis://localhost:6379/0}"}
providers:
  openai: {kind: openai, api_key: "${OPENAI_API_KEY}", base_url: "https://${HOST:-api.openai.com}/v1"}
  local: {kind: vllm, base_url: "${VLLM_URL:-http://127.0.0.1:8000/v1}"}
"""
    loaded = parse_config(text, env={"OPENAI_API_KEY": "sk-1", "HOST": "proxy.internal"})
    assert loaded.config.redis.url == "redis://localhost:6379/0"
    assert loaded.providers["openai"].api_key == "sk-1"
    assert loaded.providers["openai"].base_url == "https://proxy.internal/v1"
    assert loaded.providers["local"].base_url == "http://127.0.0.1:8000/v1"
    assert loaded.missing_env == {}


def test_empty_default_and_empty_variable() -> None:
    loaded = parse_config(
        'redis: {url: "${REDIS_URL:-}"}\nproviders: {o: {kind: openai, api_key: "${K}"}}', env={"K": ""}
    )
    assert loaded.config.redis.url == ""
    # An empty variable counts as unset for a reference without a default.
    assert loaded.missing_env == {"providers.o.api_key": ["K"]}


def test_unset_variable_is_recorded_and_marks_the_provider_unavailable() -> None:
    text = """
providers:
  openai: {kind: openai, api_key: "${OPENAI_API_KEY}"}
  demo: {kind: fake}
"""
    loaded = parse_config(text, env={})
    assert loaded.missing_env == {"providers.openai.api_key": ["OPENAI_API_KEY"]}
    assert loaded.missing_for("providers.openai") == ["OPENAI_API_KEY"]
    assert loaded.missing_for("providers.open") == []
    router = Router(loaded)
    assert router.unavailable_providers() == {
        "openai": "Provider 'openai' is unavailable: environment variable OPENAI_API_KEY is not set"
    }
    assert router.resolve("demo/text").unavailable is None


def test_several_variables_in_one_value() -> None:
    loaded = parse_config('providers: {o: {kind: openai, api_key: "${A}-${B}-${C:-c}"}}', env={"B": "b"})
    assert loaded.providers["o"].api_key == "-b-c"
    assert loaded.missing_env == {"providers.o.api_key": ["A"]}


@pytest.mark.parametrize(
    "text,expected",
    [
        ("foo: 1", "gw.yaml: foo: unknown key"),
        ("server: {port: 8080, hots: x}", "gw.yaml: server.hots: unknown key"),
        (
            "providers: {x: {kind: nope}}",
            "gw.yaml: providers.x.kind: Invalid enum value 'nope'; valid kinds: " + ", ".join(sorted(REGISTRY)),
        ),
        ("providers: {x: {kind: fake, bogus: 1}}", "gw.yaml: providers.x.bogus: unknown key"),
        (
            "providers: {x: {kind: openai, deployments: {east: {bogus: 1}}}}",
            "gw.yaml: providers.x.deployments.east.bogus: unknown key",
        ),
        ("providers: {x: {api_key: k}}", "gw.yaml: providers.x.kind: required key is missing"),
        (
            "providers: {x: {kind: fake}}\nmodels: [{name: a, targets: [{model: x/y}, {weight: 2}]}]",
            "gw.yaml: models[0].targets[1].model: required key is missing",
        ),
        (
            "providers: {x: {kind: fake}}\nmodels: [{name: a, targets: [{model: x/y}, {model: 5}]}]",
            "gw.yaml: models[0].targets[1].model: Expected `str`, got `int`",
        ),
        (
            "providers: {x: {kind: fake}}\nmodels: [{name: a, targets: [{model: x/y}, {model: z/y}]}]",
            "gw.yaml: models[0].targets[1].model: unknown provider 'z' in 'z/y'",
        ),
        (
            "providers: {x: {kind: fake}}\nmodels: [{name: a, targets: [{model: x}]}]",
            "gw.yaml: models[0].targets[0].model: expected vendor/model_name, got 'x'",
        ),
        (
            "providers: {x: {kind: fake}}\nmodels: [{name: a, targets: [{model: x/y, weight: 0}]}]",
            "gw.yaml: models[0].targets[0].weight: Expected `float` > 0.0",
        ),
        ("models: [{name: a, targets: []}]", "gw.yaml: models[0].targets: Expected `array` of length >= 1"),
        ("server: {port: 70000}", "gw.yaml: server.port: Expected `int` <= 65535"),
        ("unsupported_params: ignore", "gw.yaml: unsupported_params: Invalid enum value 'ignore'"),
        ("keys: [{name: a}]", "gw.yaml: keys[0].key: required key is missing"),
        ("keys: [{name: a, key: x}, {name: a, key: y}]", "gw.yaml: keys[1].name: duplicate key name 'a'"),
        ("- 1", "gw.yaml: (top level): expected a mapping, got list"),
        ("providers: [1]", "gw.yaml: providers: Expected `object`, got `array`"),
        ("providers: {x: 5}", "gw.yaml: providers.x: Expected `object`, got `int`"),
        ('providers: {"a/b": {kind: fake}}', "gw.yaml: providers.a/b: a provider name may not be empty or contain '/'"),
        (
            "providers: {x: {kind: openai, base_url: 'api.openai.com'}}",
            "gw.yaml: providers.x.base_url: must start with http:// or https://, got 'api.openai.com'",
        ),
        ("server: {port: [", "gw.yaml: line 1, column 17: expected the node content, but found '<stream end>'"),
        (
            "keys: [{name: a, key: k, max_cost_per_day: 1.0e+308}]",
            "gw.yaml: keys[0].max_cost_per_day: Expected `float` <= 1000000000.0",
        ),
        (
            "providers: {x: {kind: vllm, replicas: ['http://a:8000/v1'], deployments: {d: {api_key: k}}}}",
            "gw.yaml: providers.x.deployments: give either deployments or replicas, not both",
        ),
        (
            "providers: {v: {kind: vllm, base_url: 'http://127.0.0.1:abc/v1'}}",
            "gw.yaml: providers.v.base_url: is not a valid URL (Port could not be cast to integer value as 'abc')",
        ),
        ("providers: {v: {kind: vllm, base_url: 'http:///v1'}}", "gw.yaml: providers.v.base_url: has no host"),
        ("providers: {v: {kind: vllm, replicas: ['http://']}}", "gw.yaml: providers.v.replicas[0]: has no host"),
        (
            "providers: {v: {kind: vllm, base_url: 'http://h /v1'}}",
            "gw.yaml: providers.v.base_url: must not contain spaces or control characters",
        ),
        (
            "providers: {v: {kind: vllm, base_url: 'http://h/v1', tokenizer_url: 'http://h/#t'}}",
            "gw.yaml: providers.v.tokenizer_url: must not carry a query (?...) or a fragment (#...); "
            "set a headers: entry for a credential",
        ),
        (
            "providers: {o: {kind: openai, headers: {'x key': v}}}",
            "gw.yaml: providers.o.headers.x key: is not a valid HTTP header name",
        ),
        (
            'providers: {o: {kind: openai, headers: {x-a: "v\\r\\nx-b: 1"}}}',
            "gw.yaml: providers.o.headers.x-a: value contains a line break or another control character "
            "(a trailing newline from its file or variable?)",
        ),
        (
            "ledger: {url: 'sqlite:///gw.db', retention_days: 1000000000000}",
            "gw.yaml: ledger.retention_days: Expected `int` <= 36500",
        ),
        ("prices: {5: {prompt_per_1m: 1}}", "gw.yaml: prices: Expected `str`, got `int` for a key (quote it)"),
    ],
)
def test_errors_are_one_line_naming_the_path(text: str, expected: str) -> None:
    assert error(text) == expected


def test_duplicate_alias() -> None:
    text = """
providers: {x: {kind: fake}}
models:
  - {name: fast, targets: [{model: x/a}]}
  - {name: fast, targets: [{model: x/b}]}
"""
    assert error(text) == "gw.yaml: models[1].name: duplicate alias 'fast'"


def test_alias_of_an_alias_is_a_config_error_not_a_router_crash() -> None:
    text = """
providers: {x: {kind: fake}}
models:
  - {name: fast, targets: [{model: x/a}]}
  - {name: faster, targets: [{model: fast}]}
"""
    assert error(text) == "gw.yaml: models[1].targets[0].model: 'fast' is an alias, not vendor/model_name"


def test_alias_named_like_a_direct_model_may_target_it() -> None:
    text = "providers: {x: {kind: fake}}\nmodels: [{name: x/text, targets: [{model: x/text}]}]"
    router = Router(parse_config(text, env={}))
    assert router.resolve("x/text").endpoint.model == "text"


@pytest.mark.parametrize("kind", ["azure", "vllm", "pais", "sgp"])
def test_base_url_required(kind: str) -> None:
    assert error(f"providers: {{p: {{kind: {kind}}}}}") == f"gw.yaml: providers.p.base_url: required for kind '{kind}'"


@pytest.mark.parametrize("kind", ["openai", "fireworks", "together", "deepseek", "fake"])
def test_base_url_optional(kind: str) -> None:
    assert parse_config(f"providers: {{p: {{kind: {kind}}}}}", env={}).providers["p"].kind == kind


def test_azure_deployments_may_carry_the_base_url() -> None:
    text = "providers: {az: {kind: azure, deployments: {east: {base_url: 'https://east.example'}}}}"
    assert parse_config(text, env={}).providers["az"].deployments["east"].base_url == "https://east.example"
    missing = "providers: {az: {kind: azure, deployments: {east: {base_url: 'https://e'}, west: {}}}}"
    assert error(missing) == "gw.yaml: providers.az.base_url: required for kind 'azure'"


def test_a_wrongly_typed_value_from_a_reference_names_the_variable() -> None:
    port = "server:\n  port: ${GW_PORT}\n"
    unset = "gw.yaml: server.port: Expected `int`, got `str` (environment variable GW_PORT is not set)"
    assert error(port) == unset
    is_set = "gw.yaml: server.port: Expected `int`, got `str` (from ${GW_PORT}: a reference always makes a string)"
    assert error(port, {"GW_PORT": "8080"}) == is_set
    policy = "gw.yaml: redis.on_failure: Invalid enum value '' (environment variable RF is not set)"
    assert error('redis: {on_failure: "${RF}"}') == policy


def test_load_config_strict(tmp_path: Path) -> None:
    path = tmp_path / "gw.yaml"
    path.write_text('providers: {o: {kind: openai, api_key: "${NOT_SET_ANYWHERE}"}}\n', encoding="utf-8")
    assert load_config(path, env={}).missing_env == {"providers.o.api_key": ["NOT_SET_ANYWHERE"]}
    with pytest.raises(ConfigError) as info:
        load_config(path, env={}, strict=True)
    assert str(info.value) == f"{path}: providers.o.api_key: environment variable NOT_SET_ANYWHERE is not set"
    assert load_config(path, env={"NOT_SET_ANYWHERE": "v"}, strict=True).providers["o"].api_key == "v"


def test_load_config_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "absent.yaml"
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    assert str(info.value) == f"{path}: (file): No such file or directory"


def test_load_config_not_utf8_names_the_line_not_the_bytes(tmp_path: Path) -> None:
    path = tmp_path / "gw.yaml"
    path.write_bytes(b'# saved as Latin-1\nadmin: {key: "s\xe9cret"}\n')
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    assert str(info.value) == f"{path}: line 2: not UTF-8 text"


def test_shipped_config_loads() -> None:
    shipped = Path(__file__).resolve().parents[2] / "config.yaml"
    loaded = load_config(shipped, env={})
    assert set(loaded.providers) >= {"demo", "openai", "local"}
    router = Router(loaded)
    assert router.resolve("demo/echo").provider == "demo"
    assert "openai" in router.unavailable_providers()


@pytest.mark.parametrize(
    "text",
    [
        "providers: {v: {kind: vllm, base_url: 'admin:s3cr3t@h:8000/v1'}}",
        "providers: {v: {kind: vllm, base_url: 'http://h:8000/v1?api_key=s3cr3t'}}",
        "providers: {v: {kind: vllm, base_url: 'http://h/v1', tokenizer_url: 'admin:s3cr3t@h/'}}",
        "providers: {v: {kind: vllm, replicas: ['admin:s3cr3t@h:8000/v1']}}",
        "providers: {v: {kind: vllm, replicas: [{url: 'http://[::1/v1?key=s3cr3t'}]}}",
    ],
)
def test_a_bad_url_is_refused_without_echoing_its_secret(text: str) -> None:
    message = error(text)
    assert message.startswith("gw.yaml: providers.v.") and "s3cr3t" not in message, message


def test_a_url_built_from_an_unset_variable_only_marks_its_provider_unavailable() -> None:
    loaded = parse_config('providers: {v: {kind: vllm, base_url: "http://${VLLM_HOST}/v1"}}', env={})
    assert loaded.missing_env == {"providers.v.base_url": ["VLLM_HOST"]}
    assert "VLLM_HOST" in Router(loaded).unavailable_providers()["v"]


def test_a_key_given_twice_in_one_mapping_is_refused_naming_its_line_and_column() -> None:
    twice_top = "server: {port: 1}\nserver: {port: 2}\n"
    assert error(twice_top) == "gw.yaml: line 2, column 1: duplicate key 'server' in one mapping"
    twice = "providers:\n  x: {kind: fake}\n  x: {kind: openai}\n"
    assert error(twice) == "gw.yaml: line 3, column 3: duplicate key 'x' in one mapping"
    # What a `<<` merge brings in may be overridden: that is what a merge is for.
    merged = "providers:\n  p: &base {kind: fake, models: [a]}\n  q: {<<: *base, models: [b]}\n"
    assert parse_config(merged, env={}).providers["q"].models == ["b"]


def test_two_client_keys_with_one_secret_are_refused_without_showing_it() -> None:
    text = "keys: [{name: a, key: s3cr3t}, {name: b, key: s3cr3t}]"
    assert error(text) == "gw.yaml: keys[1].key: the same secret as key 'a'; each key needs its own"
    # Two keys whose variables are unset are both disabled, not the same key.
    unset = 'keys: [{name: a, key: "${KEY_A}"}, {name: b, key: "${KEY_B}"}]'
    assert len(parse_config(unset, env={}).config.keys) == 2


@pytest.mark.parametrize(
    "text,path",
    [
        ('providers: {o: {kind: openai, api_key: "s3cr3t\\n"}}', "providers.o.api_key"),
        (
            'providers: {a: {kind: azure, deployments: {d: {base_url: "https://a", api_key: "s3cr3t\\r"}}}}',
            "providers.a.deployments.d.api_key",
        ),
        ('keys: [{name: a, key: "s3cr3t\\n"}]', "keys[0].key"),
    ],
)
def test_a_secret_with_a_line_break_is_refused_without_showing_it(text: str, path: str) -> None:
    message = error(text)
    assert message.startswith(f"gw.yaml: {path}: contains a line break") and "s3cr3t" not in message, message
