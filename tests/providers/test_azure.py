"""Azure OpenAI: deployment URL with api-version, `api-key` auth, OpenAI's parameters."""

from __future__ import annotations

import pytest

from gateway.config import parse_config
from gateway.path.routing import Router
from providers.azure import DEFAULT_API_VERSION, AzureAdapter
from providers.base import Endpoint
from providers.openai_compat import OPENAI_PARAMS
from tests.helpers.adapters import build, request
from wire.errors import UnsupportedParamError

ADAPTER = AzureAdapter()
BASE_HEADERS = {"content-type": "application/json", "accept": "application/json"}


def test_default_api_version_url_and_api_key_header() -> None:
    endpoint = Endpoint(
        provider="azure", model="gpt-35-instruct", base_url="https://res.openai.azure.com/", api_key="az"
    )
    up, body, _ = build(ADAPTER, request("azure/gpt-35-instruct", max_tokens=5, stop="\n"), endpoint)
    assert DEFAULT_API_VERSION == "2024-10-21"
    assert (
        up.url == "https://res.openai.azure.com/openai/deployments/gpt-35-instruct/completions?api-version=2024-10-21"
    )
    assert up.headers == {**BASE_HEADERS, "api-key": "az"}
    assert body == {"model": "gpt-35-instruct", "prompt": "Say this is a test", "max_tokens": 5, "stop": ["\n"]}


def test_configured_api_version() -> None:
    endpoint = Endpoint(
        provider="azure", model="dep", base_url="https://res.openai.azure.com", api_key="az", api_version="2024-02-01"
    )
    up, _, _ = build(ADAPTER, request(), endpoint)
    assert up.url == "https://res.openai.azure.com/openai/deployments/dep/completions?api-version=2024-02-01"


def test_deployment_id_is_url_quoted() -> None:
    endpoint = Endpoint(provider="azure", model="my dep:x", base_url="https://res.openai.azure.com")
    up, _, _ = build(ADAPTER, request(), endpoint)
    assert up.url == "https://res.openai.azure.com/openai/deployments/my%20dep%3Ax/completions?api-version=2024-10-21"
    assert "api-key" not in up.headers and "authorization" not in up.headers


def test_same_parameters_as_openai() -> None:
    assert ADAPTER.params == OPENAI_PARAMS
    with pytest.raises(UnsupportedParamError) as info:
        build(ADAPTER, request(top_k=3), Endpoint(provider="az", model="d", base_url="https://x"))
    assert (info.value.param, info.value.message) == ("top_k", "Parameter 'top_k' is not supported by provider 'az'")


def test_stream_request() -> None:
    endpoint = Endpoint(provider="azure", model="dep", base_url="https://res.openai.azure.com", api_key="az")
    up, body, _ = build(ADAPTER, request(stream=True), endpoint)
    assert up.stream is True
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}


CONFIG = """
providers:
  azure:
    kind: azure
    base_url: https://main.openai.azure.com
    api_key: ${AZ_MAIN}
    api_version: "2024-06-01"
    deployments:
      east: {base_url: "https://east.openai.azure.com", api_key: "${AZ_EAST}"}
      west: {base_url: "https://west.openai.azure.com", api_key: "${AZ_WEST}", api_version: "2024-02-01"}
"""


def test_routed_deployment_uses_its_own_base_url_key_and_version() -> None:
    router = Router(parse_config(CONFIG, env={"AZ_MAIN": "k-main", "AZ_EAST": "k-east", "AZ_WEST": "k-west"}))

    east = router.resolve("azure/gpt-4o-instruct/east")
    assert east.endpoint.model == "gpt-4o-instruct" and east.endpoint.deployment == "east"
    up, _, _ = build(ADAPTER, request("azure/gpt-4o-instruct/east"), east.endpoint)
    assert (
        up.url == "https://east.openai.azure.com/openai/deployments/gpt-4o-instruct/completions?api-version=2024-06-01"
    )
    assert up.headers["api-key"] == "k-east"

    west = router.resolve("azure/gpt-4o-instruct/west")
    up, _, _ = build(ADAPTER, request("azure/gpt-4o-instruct/west"), west.endpoint)
    assert (
        up.url == "https://west.openai.azure.com/openai/deployments/gpt-4o-instruct/completions?api-version=2024-02-01"
    )
    assert up.headers["api-key"] == "k-west"

    main = router.resolve("azure/gpt-4o-instruct")
    up, _, _ = build(ADAPTER, request("azure/gpt-4o-instruct"), main.endpoint)
    assert (
        up.url == "https://main.openai.azure.com/openai/deployments/gpt-4o-instruct/completions?api-version=2024-06-01"
    )
    assert up.headers["api-key"] == "k-main"
