"""providers/registry.py: the one list of kinds, and what `register` refuses."""

from __future__ import annotations

from typing import Any

import pytest

from providers.base import Adapter, Endpoint
from providers.registry import BUILTIN, REGISTRY, credential_headers, kinds, register
from providers.vllm import VLLMAdapter
from tests.helpers import adapters


def test_every_builtin_line_is_registered_under_its_class_kind() -> None:
    assert len(REGISTRY) == len(BUILTIN)
    for target in BUILTIN:
        module, _, name = target.partition(":")
        found = [kind for kind, c in REGISTRY.items() if c.__module__ == module and c.__name__ == name]
        assert len(found) == 1, target
        assert REGISTRY[found[0]].kind == found[0]
    assert kinds() == sorted(REGISTRY)


def test_credential_headers_are_the_union_of_the_declarations() -> None:
    assert credential_headers() == {"authorization", "api-key", "x-api-key", "x-goog-api-key"}


@pytest.mark.parametrize("kind", sorted(REGISTRY))
def test_the_credential_an_adapter_sends_is_in_the_headers_it_declares(kind: str) -> None:
    cls = REGISTRY[kind]
    if not issubclass(cls, Adapter):
        assert cls.credential_headers == frozenset()
        return
    endpoint = Endpoint(provider="p", model="m", base_url="https://h", api_key="the-key", region="us-east-1")
    request = cls().build_request(adapters.request(prompt="x"), endpoint, {})
    # The headers carrying the key, bare or after a scheme ("Bearer the-key").
    sent = {name for name, value in request.headers.items() if value.split()[-1:] == ["the-key"]}
    assert sent
    assert set(cls().auth_headers(endpoint)) <= cls.credential_headers
    assert sent <= cls.credential_headers, sent


@pytest.mark.parametrize(
    ("adapter", "error", "match"),
    [
        (dict, TypeError, "is not an Adapter"),
        ("providers.vllm", ValueError, "module:Class"),
        ("providers.vllm:NoSuchClass", AttributeError, "NoSuchClass"),
        (type("Upper", (VLLMAdapter,), {"kind": "Shouty"}), ValueError, "lower-case identifier"),
        (type("Twin", (VLLMAdapter,), {}), ValueError, "already registered to providers.vllm.VLLMAdapter"),
        (type("Local", (VLLMAdapter,), {"kind": "local", "in_process": True}), ValueError, "in_process"),
        (type("NoChat", (VLLMAdapter,), {"kind": "nochat2", "chat_route": False}), ValueError, "chat_route"),
        (type("Chat", (Adapter,), {"kind": "chat2", "chat_route": True}), ValueError, "chat_route"),
    ],
)
def test_register_refuses(adapter: Any, error: type[Exception], match: str) -> None:
    before = dict(REGISTRY)
    with pytest.raises(error, match=match):
        register(adapter)
    assert REGISTRY == before
