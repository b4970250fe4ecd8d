"""Issue 11, item 2, one layer down: every adapter that puts the model into a URL keeps it one segment.

`normalize` already refuses `.`/`..` segments, `?`, `#` and backslashes before routing (the e2e tests
beside this one); these check the adapters' own guard (providers.base.path_segment), which also covers
a model id assembled from config, e.g. a deployment's `name`.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from providers.azure import AzureAdapter
from providers.base import Adapter, Endpoint, path_segment
from providers.bedrock import BedrockAdapter
from providers.gemini import GeminiAdapter
from tests.helpers.adapters import build, request
from wire.errors import InvalidRequestError

ADAPTERS: list[tuple[Adapter, Endpoint]] = [
    (GeminiAdapter(), Endpoint(provider="gem", model="", base_url="https://g.example", api_key="k")),
    (AzureAdapter(), Endpoint(provider="az", model="", base_url="https://a.example", api_key="k")),
    (
        BedrockAdapter(),
        Endpoint(provider="bed", model="", base_url="https://b.example", api_key="AKID:secret", region="us-east-1"),
    ),
]


@pytest.mark.parametrize("adapter,endpoint", ADAPTERS, ids=lambda a: type(a).__name__)
@pytest.mark.parametrize("model", ["", ".", ".."])
def test_dot_segments_never_reach_a_url(adapter: Adapter, endpoint: Endpoint, model: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        build(adapter, request(), msgspec.structs.replace(endpoint, model=model))
    assert info.value.param == "model"


@pytest.mark.parametrize("adapter,endpoint", ADAPTERS[:2], ids=lambda a: type(a).__name__)
@pytest.mark.parametrize("model", ["a/b", "a/../b", "models/a/b"])
def test_one_segment_ids_refuse_a_slash(adapter: Adapter, endpoint: Endpoint, model: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        build(adapter, request(), msgspec.structs.replace(endpoint, model=model))
    assert info.value.param == "model"


@pytest.mark.parametrize(
    "value,kwargs,expected",
    [
        ("m:countTokens", {}, "m%3AcountTokens"),
        ("a b?c#d%2F", {}, "a%20b%3Fc%23d%252F"),
        ("arn:x/y", {"slash": True, "safe": ":"}, "arn:x%2Fy"),
        ("モデル", {}, "%E3%83%A2%E3%83%87%E3%83%AB"),
        ("...", {}, "..."),
    ],
)
def test_path_segment_encodes(value: str, kwargs: dict[str, Any], expected: str) -> None:
    assert path_segment(value, "p", **kwargs) == expected
