"""Issue 11, items 1 and 7: what a client may put in `inference_extra_headers`.

Hop-by-hop and framing headers (`Expect: 100-continue` desynced the upstream pool) are refused with a 400
naming the field on every dialect's route, before any upstream I/O. Headers the operator pinned in a
provider's config, and the credentials, always win over the client's.
"""

from __future__ import annotations

import httpx
import pytest

from tests.helpers.errors import ALL_ROUTES, assert_field_error
from tests.helpers.upstreams import Recorder

from .conftest import SGP_ACCOUNT, post

REFUSED = [
    "Expect",
    "Connection",
    "Keep-Alive",
    "Transfer-Encoding",
    "TE",
    "Trailer",
    "Upgrade",
    "Content-Length",
    "Host",
    "Proxy-Authorization",
    "Proxy-Connection",
    "proxy-anything",
    "Accept-Encoding",
    "Content-Encoding",
    "HTTP2-Settings",
    # Underscore spellings, which CGI/WSGI-style upstreams read as the `-` ones.
    "x_api_key",
    "X_Api_Key",
    "api_key",
    "x_goog_api_key",
    "Proxy_Authorization",
    "content_length",
    "Transfer_Encoding",
]
VALUES = {"Expect": "100-continue", "Content-Length": "0", "Transfer-Encoding": "chunked", "Upgrade": "h2c"}


@pytest.mark.parametrize("route", ALL_ROUTES)
@pytest.mark.parametrize("name", REFUSED)
def test_hop_by_hop_and_framing_headers_are_refused(client: httpx.Client, up: Recorder, route: str, name: str) -> None:
    body = {
        "model": "up/davinci-002",
        "prompt": "hi",
        "inference_extra_headers": {"x-trace-id": "t-1", name: VALUES.get(name, "1")},
    }
    resp = post(client, route, body)
    err = assert_field_error(resp, route, "inference_extra_headers")
    assert name in str(err)
    assert up.received == []


def test_a_harmless_client_header_still_passes(client: httpx.Client, up: Recorder) -> None:
    resp = post(
        client,
        "/v1/completions",
        {"model": "up/davinci-002", "prompt": "hi", "inference_extra_headers": {"X-Trace-Id": "t-9"}},
    )
    assert resp.status_code == 200, resp.text
    assert up.only().headers["x-trace-id"] == "t-9"


@pytest.mark.parametrize("route", ALL_ROUTES)
def test_operator_pinned_headers_win_over_the_clients(client: httpx.Client, up: Recorder, route: str) -> None:
    body = {
        "model": "sgp/some-model",
        "prompt": "hi",
        # Another account reached with the gateway's key, and a second credential: neither gets through.
        "inference_extra_headers": {"x-selected-account-id": "acct-of-someone-else", "X-Trace-Id": "t-2"},
    }
    resp = post(client, route, body)
    assert resp.status_code == 200, resp.text
    got = up.only().headers
    assert got["x-selected-account-id"] == SGP_ACCOUNT
    assert got["x-api-key"] == "sgp-key"
    assert got["x-trace-id"] == "t-2"


def test_underscore_spellings_of_pinned_headers_do_not_reach_the_upstream(client: httpx.Client, up: Recorder) -> None:
    body = {
        "model": "sgp/some-model",
        "prompt": "hi",
        # Upstreams that map `-` and `_` to one variable would read either beside the operator's header.
        "inference_extra_headers": {
            "x_selected_account_id": "acct-of-someone-else",
            "X_Selected-Account_Id": "acct-of-someone-else",
            "x_trace_id": "t-3",
        },
    }
    resp = post(client, "/v1/completions", body)
    assert resp.status_code == 200, resp.text
    got = up.only().headers
    assert got["x-selected-account-id"] == SGP_ACCOUNT
    assert not [name for name in got if "_" in name]
    assert got["x-trace-id"] == "t-3"  # a harmless one passes, spelled with `-`


def test_client_cannot_replace_the_gateways_accept(client: httpx.Client, up: Recorder) -> None:
    body = {"model": "up/davinci-002", "prompt": "hi", "inference_extra_headers": {"Accept": "text/html"}}
    resp = post(client, "/v1/completions", body)
    assert resp.status_code == 200, resp.text
    assert up.only().headers["accept"] == "application/json"


@pytest.mark.parametrize("route", ALL_ROUTES)
def test_client_cannot_turn_off_the_stream_usage_the_gateway_settles_on(
    client: httpx.Client, up: Recorder, route: str
) -> None:
    body = {
        "model": "up/davinci-002",
        "prompt": "hi",
        "stream": True,
        "inference_extra_params": {"stream_options": {"include_usage": False}},
    }
    resp = post(client, route, body)
    assert_field_error(resp, route, "inference_extra_params")
    assert up.received == []


@pytest.mark.parametrize("route", ALL_ROUTES)
@pytest.mark.parametrize(
    "extra", [{"n": 100}, {"best_of": 50}, {"max_tokens": 100000}, {"max_completion_tokens": 9}, {"max_new_tokens": 9}]
)
def test_client_cannot_outgrow_the_accounted_fields_through_extra_params(
    client: httpx.Client, up: Recorder, route: str, extra: dict[str, int]
) -> None:
    # Token reservations, the choice cap and the emulation caps are computed from the request's own fields.
    body = {"model": "up/davinci-002", "prompt": "hi", "inference_extra_params": extra}
    resp = post(client, route, body)
    assert_field_error(resp, route, "inference_extra_params")
    assert up.received == []


@pytest.mark.parametrize("route", ALL_ROUTES)
def test_at_most_64_client_headers(client: httpx.Client, up: Recorder, route: str) -> None:
    extra = {f"x-h{i}": "v" for i in range(65)}
    body = {"model": "up/davinci-002", "prompt": "hi", "inference_extra_headers": extra}
    resp = post(client, route, body)
    assert_field_error(resp, route, "inference_extra_headers")
    assert up.received == []
    del extra["x-h64"]
    assert post(client, route, body).status_code == 200
