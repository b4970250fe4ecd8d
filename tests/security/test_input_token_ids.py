"""Token-id prompts on every completion dialect: how many ids one request may send, and which ids are ids.

`caps.prompt_token_ids` (4096 in this suite's config, 1 Mi by default) bounds the ids of one request's
`prompt`, all its prompts together: one more is a 400 naming `prompt` (FastAPI's 422 with `loc` on SGP and
PAIS), however small the body, before any upstream call. An id that is negative, past 64 bits, a boolean or
a number with a fraction is refused the same way. `caps.param_token_ids` (1000 here, 262,144 by default)
bounds `stop_token_ids` and `allowed_token_ids` each, and the entries of `logit_bias`, on completions and
chat alike.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.helpers.errors import ALL_ROUTES, assert_field_error
from tests.helpers.upstreams import Recorder

from .conftest import post

CAP = 4096
MODEL = "up/davinci-002"


def _raw(prompt: str) -> bytes:
    # Written as text: an id past 64 bits or a float that is whole must reach the gateway as sent.
    return b'{"model": "%s", "prompt": %s, "max_tokens": 1}' % (MODEL.encode(), prompt.encode())


@pytest.mark.parametrize("route", ALL_ROUTES)
@pytest.mark.parametrize(
    "prompt",
    [
        pytest.param([7] * (CAP + 1), id="one-list"),
        pytest.param([[7] * 1366, [7] * 1366, [7] * 1365], id="batch-of-lists"),
    ],
)
def test_token_ids_past_the_cap_are_a_400_naming_prompt(
    client: httpx.Client, up: Recorder, route: str, prompt: list[Any]
) -> None:
    resp = post(client, route, {"model": MODEL, "prompt": prompt, "max_tokens": 1})
    body = assert_field_error(resp, route, "prompt")
    assert "caps.prompt_token_ids" in json.dumps(body)
    assert f"holds {CAP + 1} token ids" in json.dumps(body)
    assert up.received == []


@pytest.mark.parametrize("route", ALL_ROUTES)
def test_token_ids_up_to_the_cap_go_upstream(client: httpx.Client, up: Recorder, route: str) -> None:
    resp = post(client, route, {"model": MODEL, "prompt": [7] * CAP, "max_tokens": 1})
    assert resp.status_code == 200, resp.text
    assert len(up.received) == 1 and up.received[0].json()["prompt"] == [7] * CAP


@pytest.mark.parametrize("route", ALL_ROUTES)
@pytest.mark.parametrize(
    "prompt",
    [
        pytest.param("[1, -2]", id="negative"),
        pytest.param("[[1], [-2]]", id="negative-in-a-batch"),
        pytest.param("[1, 9223372036854775808]", id="past-int64"),
        pytest.param("[[1, 99999999999999999999999999]]", id="past-int64-in-a-batch"),
        pytest.param("[1, -9223372036854775809]", id="below-int64"),
        pytest.param("[1, true]", id="bool"),
        pytest.param("[[false]]", id="bool-in-a-batch"),
        pytest.param("[1, 2.5]", id="float"),
        pytest.param("[1, 2.0]", id="whole-float"),
        pytest.param("[[1e3]]", id="exponent-in-a-batch"),
        pytest.param("[null]", id="null"),
        pytest.param("[[1, [2]]]", id="nested-too-deep"),
    ],
)
def test_an_id_that_is_no_token_id_is_a_400_naming_prompt(
    client: httpx.Client, up: Recorder, route: str, prompt: str
) -> None:
    resp = post(client, route, _raw(prompt))
    assert_field_error(resp, route, "prompt")
    assert up.received == []


PARAM_CAP = 1000


def _ids(field: str, count: int) -> Any:
    """`count` token ids as `field` takes them: a list, or `logit_bias`'s map of ids to biases."""
    return {str(i): 1 for i in range(count)} if field == "logit_bias" else list(range(count))


ID_LISTS = ("stop_token_ids", "allowed_token_ids", "logit_bias")


@pytest.mark.parametrize("route", ALL_ROUTES)
@pytest.mark.parametrize("field", ID_LISTS)
def test_a_list_of_ids_past_the_cap_is_a_400_naming_it(
    client: httpx.Client, up: Recorder, route: str, field: str
) -> None:
    resp = post(client, route, {"model": MODEL, "prompt": "hi", "max_tokens": 1, field: _ids(field, PARAM_CAP + 1)})
    body = assert_field_error(resp, route, field)
    assert "caps.param_token_ids" in json.dumps(body)
    assert up.received == []


@pytest.mark.parametrize("field", ID_LISTS)
def test_a_chat_list_of_ids_past_the_cap_is_a_400_naming_it(client: httpx.Client, up: Recorder, field: str) -> None:
    chat = {
        "model": "up/gpt-4o-mini",
        "messages": [{"role": "user", "content": "hi"}],
        field: _ids(field, PARAM_CAP + 1),
    }
    resp = post(client, "/v1/chat/completions", chat)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert (error["param"], error["code"]) == (field, "invalid_value")
    assert "caps.param_token_ids" in error["message"]
    assert up.received == []


@pytest.mark.parametrize("field", ID_LISTS)
def test_a_list_of_ids_up_to_the_cap_is_taken(client: httpx.Client, up: Recorder, field: str) -> None:
    resp = post(
        client, "/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 1, field: _ids(field, PARAM_CAP)}
    )
    assert resp.status_code == 200, resp.text
