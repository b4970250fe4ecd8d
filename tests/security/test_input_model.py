"""Issue 11, items 2 and 9: the model string a client sends.

It is matched against key globs, echoed in a response header and a log line, and may become part of an
upstream URL. Before routing, a name that is not 1-256 printable characters, or holds `?`, `#`, a
backslash or a `.`/`..` segment, is a 400 naming `model` on every dialect's route, and no upstream is
called. Adapters that put the model into a URL encode it as one path segment (Gemini and Azure refuse a
`/` their APIs cannot have; Bedrock ARNs keep theirs as `%2F`). Every response header stays encodable.
"""

from __future__ import annotations

from urllib.parse import unquote

import httpx
import pytest

from tests.helpers.errors import ALL_ROUTES, assert_field_error
from tests.helpers.upstreams import Recorder

from .conftest import post

REFUSED_BEFORE_ROUTING = [
    "gem/m/../other",  # another path of Google's host, with the gateway's key
    "gem/m:countTokens#",  # another method; `#` cuts the rest of the URL
    "gem/m?key=x",
    "gem/m\\..\\other",
    "up/..",
    "up/./davinci-002",
    "up/a\x01b",  # a control character: a response header could not carry it
    "up/a\nb",
    "up/a\x7fb",
    "up/a\u200bb",  # zero-width space (a format character)
    "up/" + "m" * 300,
    "",
]


@pytest.mark.parametrize("route", ALL_ROUTES)
@pytest.mark.parametrize("model", REFUSED_BEFORE_ROUTING, ids=repr)
def test_unsafe_model_names_are_refused_before_routing(
    client: httpx.Client, up: Recorder, route: str, model: str
) -> None:
    resp = post(client, route, {"model": model, "prompt": "hi"})
    assert_field_error(resp, route, "model")
    assert up.received == []


@pytest.mark.parametrize("model", ["gem/m/other", "gem/models/a/b", "az/dep/x"])
def test_a_slash_in_a_one_segment_model_id_is_refused(client: httpx.Client, up: Recorder, model: str) -> None:
    resp = post(client, "/v1/completions", {"model": model, "prompt": "hi"})
    assert_field_error(resp, "/v1/completions", "model")
    assert up.received == []


def test_gemini_model_stays_one_segment_before_the_method(client: httpx.Client, up: Recorder) -> None:
    post(client, "/v1/completions", {"model": "gem/m:countTokens", "prompt": "hi"})
    # The `:` of the client's text is encoded; only the gateway's own `:generateContent` names a method.
    assert up.raw_paths == ["/gem/v1beta/models/m%3AcountTokens:generateContent"]
    assert up.only().query == {}


def test_azure_deployment_id_is_encoded(client: httpx.Client, up: Recorder) -> None:
    post(client, "/v1/completions", {"model": "az/my dep%2F..", "prompt": "hi"})
    (raw,) = up.raw_paths
    assert raw.startswith("/az/openai/deployments/my%20dep%252F../completions?")


def test_bedrock_arn_keeps_its_slash_encoded(client: httpx.Client, up: Recorder) -> None:
    arn = "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.amazon.nova-micro-v1:0"
    post(client, "/v1/completions", {"model": f"bed/{arn}", "prompt": "hi"})
    (raw,) = up.raw_paths
    assert raw == f"/bed/model/{arn.replace('/', '%2F')}/converse"


@pytest.mark.parametrize("stream", [False, True])
def test_non_latin1_model_name_gets_a_json_answer_with_encodable_headers(
    client: httpx.Client, up: Recorder, stream: bool
) -> None:
    model = "demo/モデル-ü"
    resp = post(client, "/v1/completions", {"model": model, "prompt": "hi", "max_tokens": 2, "stream": stream})
    assert resp.status_code == 200, resp.text
    header = resp.headers["x-gateway-model"]
    assert header.isascii() and unquote(header) == model
    if stream:
        assert resp.text.rstrip().endswith("data: [DONE]")
    else:
        assert resp.json()["model"] == model


def test_non_latin1_model_name_through_an_upstream(client: httpx.Client, up: Recorder) -> None:
    resp = post(client, "/v1/completions", {"model": "up/モデル", "prompt": "hi"})
    assert resp.status_code == 200, resp.text
    assert unquote(resp.headers["x-gateway-model"]) == "up/モデル"
    assert up.only().json()["model"] == "モデル"
