"""Model resolution: alias first, then vendor/model_name, a trailing deployment only when declared."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from gateway.config import parse_config
from gateway.path.routing import Router
from gateway.resilience.balancer import order
from gateway.resilience.health import TargetState
from providers.azure import AzureAdapter
from providers.fake import FakeAdapter
from providers.fireworks import FireworksAdapter
from wire.errors import ModelNotFoundError, ProviderUnavailableError

CONFIG = """
unsupported_params: error
providers:
  demo: {kind: fake}
  fireworks: {kind: fireworks, api_key: "${FW_KEY}", unsupported_params: drop, headers: {x-team: search}}
  local: {kind: vllm, base_url: "http://gpu:8000/v1"}
  azure:
    kind: azure
    base_url: https://main.openai.azure.com
    api_key: ${AZ_MAIN}
    deployments:
      east: {base_url: "https://east.openai.azure.com", api_key: "${AZ_EAST}", api_version: "2024-02-01"}
      nokey: {base_url: "https://nokey.openai.azure.com"}
  vl:
    kind: vllm
    base_url: http://vl:8000/v1
    deployments:
      big: {base_url: "http://big:8000/v1", name: "meta-llama/Llama-3.1-70B"}
models:
  - name: fast
    targets:
      - {model: demo/text, weight: 3}
      - {model: demo/echo, weight: 1}
  - name: one
    targets: [{model: fireworks/accounts/fireworks/models/x}]
"""
ENV = {"FW_KEY": "fw-key", "AZ_MAIN": "az-main", "AZ_EAST": "az-east"}


def router(env: dict[str, str] | None = None) -> Router:
    return Router(parse_config(CONFIG, env=ENV if env is None else env))


def test_direct_vendor_model() -> None:
    route = router().resolve("fireworks/accounts/fireworks/models/x")
    assert route.provider == "fireworks"
    assert isinstance(route.adapter, FireworksAdapter)
    assert route.endpoint.model == "accounts/fireworks/models/x"
    assert route.endpoint.deployment is None
    assert route.endpoint.base_url == "https://api.fireworks.ai/inference/v1"
    assert route.endpoint.api_key == "fw-key"
    assert dict(route.endpoint.headers) == {"x-team": "search"}
    assert route.drop_unsupported is True
    assert route.unavailable is None


def test_trailing_segment_is_a_deployment_only_when_declared() -> None:
    r = router()
    east = r.resolve("azure/gpt/east")
    assert (east.endpoint.model, east.endpoint.deployment) == ("gpt", "east")
    assert east.endpoint.base_url == "https://east.openai.azure.com"
    assert east.endpoint.api_key == "az-east"
    assert east.endpoint.api_version == "2024-02-01"
    assert isinstance(east.adapter, AzureAdapter)
    other = r.resolve("azure/gpt/west")
    assert (other.endpoint.model, other.endpoint.deployment) == ("gpt/west", None)
    assert other.endpoint.base_url == "https://main.openai.azure.com"
    assert other.endpoint.api_key == "az-main"
    assert r.resolve("azure/east").endpoint.model == "east"  # nothing before the deployment: a model name


def test_deployment_without_its_own_key_uses_the_providers() -> None:
    nokey = router().resolve("azure/gpt/nokey")
    assert (nokey.endpoint.base_url, nokey.endpoint.api_key) == ("https://nokey.openai.azure.com", "az-main")


def test_non_azure_deployment_name_replaces_the_model() -> None:
    big = router().resolve("vl/llama/big")
    assert (big.endpoint.model, big.endpoint.base_url) == ("meta-llama/Llama-3.1-70B", "http://big:8000/v1")


def test_policy_defaults_to_the_global_one() -> None:
    assert router().resolve("local/m").drop_unsupported is False


@pytest.mark.parametrize("model", ["nope/x", "demo", "demo/", "", "fast/x", "/x"])
def test_unknown_models(model: str) -> None:
    with pytest.raises(ModelNotFoundError) as info:
        router().resolve(model)
    assert (info.value.status, info.value.param, info.value.code) == (404, "model", "model_not_found")
    assert info.value.message == f"The model '{model}' does not exist"


def test_alias_wins_and_single_target() -> None:
    plan = router().plan("one")
    route = plan.single
    assert route is not None
    assert route.provider == "fireworks" and route.endpoint.model == "accounts/fireworks/models/x"


def test_weights() -> None:
    # The alias's first choice per request is the head of the balancer's weighted order.
    r = router()
    group = r.plan("fast").groups[0]
    states = {route.key: TargetState() for route in group.routes}
    rng = random.Random(20240601)
    counts = Counter(order(group, states, rng.random)[0].endpoint.model for _ in range(4000))
    assert set(counts) == {"text", "echo"}
    # 3:1 weights -> 3000 expected; 4 sigma of a binomial(4000, 0.75) is about 110.
    assert 2890 <= counts["text"] <= 3110
    assert all(isinstance(route.adapter, FakeAdapter) for route in group.routes)


def test_unset_key_marks_the_route_unavailable_naming_the_variable() -> None:
    r = router({"AZ_MAIN": "az-main"})
    route = r.resolve("fireworks/accounts/fireworks/models/x")
    assert route.unavailable == "Provider 'fireworks' is unavailable: environment variable FW_KEY is not set"
    with pytest.raises(ProviderUnavailableError) as info:
        route.require_available()
    assert (info.value.status, info.value.param, info.value.code) == (400, "model", "provider_unavailable")
    assert info.value.message == route.unavailable
    # The deployment's own key variable is what matters for a deployment route.
    east = r.resolve("azure/gpt/east")
    assert east.unavailable == "Provider 'azure' is unavailable: environment variable AZ_EAST is not set"
    assert r.resolve("azure/gpt").unavailable is None
    r.resolve("demo/text").require_available()
    assert r.unavailable_providers() == {
        "fireworks": "Provider 'fireworks' is unavailable: environment variable FW_KEY is not set"
    }


def test_model_ids() -> None:
    text = CONFIG.replace("demo: {kind: fake}", "demo: {kind: fake, models: [text, long]}")
    ids = Router(parse_config(text, env=ENV)).model_ids()
    assert ids == [
        ("fast", "gateway"),
        ("one", "gateway"),
        ("demo/text", "demo"),
        ("demo/echo", "demo"),
        ("fireworks/accounts/fireworks/models/x", "fireworks"),
        ("demo/long", "demo"),
    ]


def test_direct_routes_are_memoized() -> None:
    r = router()
    assert r.resolve("demo/text") is r.resolve("demo/text")


def test_unset_base_url_variable_does_not_fall_back_to_the_public_default() -> None:
    text = """
providers:
  openai: {kind: openai, api_key: "sk-1", base_url: "${OPENAI_PROXY_URL}"}
  azure:
    kind: azure
    base_url: https://main.openai.azure.com
    api_key: k
    deployments:
      east: {base_url: "${AZ_EAST_URL}"}
"""
    r = Router(parse_config(text, env={}))
    assert r.resolve("openai/gpt-3.5-turbo-instruct").unavailable == (
        "Provider 'openai' is unavailable: environment variable OPENAI_PROXY_URL is not set"
    )
    assert r.resolve("azure/gpt/east").unavailable == (
        "Provider 'azure' is unavailable: environment variable AZ_EAST_URL is not set"
    )
    assert r.resolve("azure/gpt").unavailable is None
    assert r.unavailable_providers() == {
        "openai": "Provider 'openai' is unavailable: environment variable OPENAI_PROXY_URL is not set"
    }
