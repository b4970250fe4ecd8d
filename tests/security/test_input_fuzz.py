"""Property tests of the client-input checks (hypothesis, bounded so CI stays fast).

Whatever a client sends as a body, a model string or extra headers: a request, or a 4xx naming the
field; never another exception. What is accepted can always be sent: the model as one URL segment and
in a response header, the headers on the upstream's wire without replacing the operator's.
"""

from __future__ import annotations

from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.edge.endpoint import _encode_headers
from gateway.path.request import normalize
from providers.base import Endpoint, path_segment, request_headers
from wire.errors import InvalidRequestError
from wire.schema import decode_request

SETTINGS = settings(max_examples=150, deadline=None)
JSON_SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8)
JSON = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=20,
)


def _submit(body: Any) -> Any:
    try:
        return normalize(decode_request(body if isinstance(body, bytes) else msgspec.json.encode(body)))
    except (msgspec.DecodeError, msgspec.ValidationError, InvalidRequestError) as exc:
        return exc


@SETTINGS
@given(st.binary(max_size=200))
def test_any_bytes(raw: bytes) -> None:
    _submit(raw)


@SETTINGS
@given(st.binary(max_size=40), st.integers(min_value=0, max_value=60))
def test_bytes_spliced_into_a_valid_body(junk: bytes, at: int) -> None:
    body = msgspec.json.encode({"model": "up/m", "prompt": "hello", "response_format": {"type": "json_object"}})
    _submit(body[:at] + junk + body[at:])


@SETTINGS
@given(
    st.dictionaries(
        st.sampled_from(["response_format", "guided_json", "inference_extra_params", "tools"]), JSON, max_size=3
    )
)
def test_free_form_fields(fields: dict[str, Any]) -> None:
    _submit({"model": "up/m", "prompt": "x", **fields})


@SETTINGS
@given(st.text(max_size=300))
def test_model_strings(model: str) -> None:
    got = _submit({"model": model, "prompt": "x"})
    if isinstance(got, Exception):
        assert isinstance(got, InvalidRequestError) and got.param == "model", got
        return
    ((_, value),) = _encode_headers({"x-gateway-model": model})
    assert value.isascii() and value.decode().isprintable()
    for slash in (False, True):
        try:
            segment = path_segment(model, "p", slash=slash)
        except InvalidRequestError as exc:
            assert exc.param == "model"
            continue
        assert segment not in (".", "..") and not any(c in segment for c in "/?#\\")
        assert segment.isascii() and segment.isprintable()


@SETTINGS
@given(st.dictionaries(st.text(max_size=12), st.text(max_size=12), max_size=4))
def test_extra_headers(extra: dict[str, str]) -> None:
    got = _submit({"model": "up/m", "prompt": "x", "inference_extra_headers": extra})
    if isinstance(got, Exception):
        assert isinstance(got, InvalidRequestError) and got.param == "inference_extra_headers", got
        return
    endpoint = Endpoint(provider="p", model="m", base_url="http://u", headers={"X-Pinned": "operator"})
    headers = request_headers(got, endpoint, auth={"authorization": "Bearer gw"})
    assert headers["x-pinned"] == "operator" and headers["authorization"] == "Bearer gw"
    assert headers["content-type"] == "application/json" and headers["accept"] == "application/json"
    for name, value in headers.items():
        name.encode("ascii")
        value.encode("latin-1")
        assert "\r" not in value and "\n" not in value
