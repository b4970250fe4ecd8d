"""Issue 11, item 3: client regexes and JSON Schemas cannot freeze a worker (ReDoS) or reach the network.

Over real sockets: the gateway under uvicorn, a loopback upstream answering text that makes `(a+)+$`
backtrack exponentially under Python's `re` (thirty `a`s and a `!` took minutes on main; 27 took 18 s).
The emulated checks now run on RE2, off the event loop: the answer is refused quickly and `/health`
keeps answering meanwhile. What RE2 cannot run, a `$ref` loop, and a remote `$ref` are refused with a
400 naming the field before any upstream call.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from aiohttp import web

from tests.helpers.errors import OPENAI_ROUTES, SGP_ROUTE, assert_error
from tests.helpers.upstreams import Received, Upstream

from .conftest import HealthProbe, answering, timed_post

EVIL = "a" * 30 + "!"
GUIDED_INVALID = "guided_output_invalid"


def _guided_failure(resp: httpx.Response, param: str) -> None:
    assert resp.status_code == 502, resp.text
    error = resp.json()["error"]
    assert (error["code"], error["param"]) == (GUIDED_INVALID, param)


@pytest.mark.parametrize(
    ("model", "field", "value", "answer"),
    [
        pytest.param("ollama/llama3", "guided_regex", "(a+)+$", EVIL, id="guided_regex"),
        pytest.param(
            "anthropic/claude-3-opus-20240229",
            "guided_json",
            {"type": "string", "pattern": "(a+)+$"},
            f'"{EVIL}"',
            id="schema-pattern",
        ),
        pytest.param(
            "anthropic/claude-3-opus-20240229",
            "guided_json",
            {"type": "object", "patternProperties": {"^(a+)+$": {"type": "integer"}}, "additionalProperties": False},
            f'{{"{EVIL}": 1}}',
            id="schema-patternProperties",
        ),
    ],
)
def test_catastrophic_pattern_is_checked_fast_and_the_loop_keeps_answering(
    gateway: Any,
    api: httpx.Client,
    upstream: Upstream,
    model: str,
    field: str,
    value: Any,
    answer: str,
) -> None:
    upstream.handler = answering(answer)
    with HealthProbe(gateway.url) as probe:
        resp, took = timed_post(
            api, "/v1/completions", {"model": model, "prompt": "a's", "max_tokens": 40, field: value}
        )
    _guided_failure(resp, field)
    # Three attempts (guided_retries: 2), each a loopback call and one linear-time check.
    assert len(upstream.received) == 3
    assert took < 1.0, took
    assert probe.answers > 0 and probe.slowest < 0.5, (probe.answers, probe.slowest)


def test_a_matching_answer_still_passes_the_re2_check(api: httpx.Client, upstream: Upstream) -> None:
    upstream.handler = answering("aaaa")
    resp, _ = timed_post(
        api, "/v1/completions", {"model": "ollama/llama3", "prompt": "a's", "guided_regex": "(a+)+", "max_tokens": 4}
    )
    assert resp.status_code == 200, resp.text
    assert resp.json()["choices"][0]["text"] == "aaaa"


REFUSED = [
    pytest.param("ollama/llama3", "guided_regex", r"(a)\1", id="regex-backreference"),
    pytest.param("ollama/llama3", "guided_regex", r"(?=a)a", id="regex-lookahead"),
    pytest.param("ollama/llama3", "guided_regex", "a" * 4097, id="regex-over-pattern_chars"),
    pytest.param(
        "anthropic/claude-3-opus-20240229",
        "guided_json",
        {"type": "string", "pattern": r"(a)\1"},
        id="schema-backreference",
    ),
    pytest.param(
        "anthropic/claude-3-opus-20240229",
        "guided_json",
        {"type": "object", "patternProperties": {r"(?<=a)b": {}}},
        id="schema-lookbehind-key",
    ),
    pytest.param("anthropic/claude-3-opus-20240229", "guided_json", {"$ref": "#"}, id="ref-loop"),
    pytest.param(
        "anthropic/claude-3-opus-20240229",
        "guided_json",
        {
            "$defs": {"a": {"anyOf": [{"$ref": "#/$defs/b"}]}, "b": {"allOf": [{"$ref": "#/$defs/a"}]}},
            "$ref": "#/$defs/a",
        },
        id="ref-loop-through-defs",
    ),
    # An index `int()` cannot read: another script's digit, more digits than it converts (4,300).
    pytest.param(
        "anthropic/claude-3-opus-20240229",
        "guided_json",
        {"prefixItems": [{}], "items": {"$ref": "#/prefixItems/\u00b2"}},
        id="ref-index-not-ascii",
    ),
    pytest.param(
        "anthropic/claude-3-opus-20240229",
        "guided_json",
        {"prefixItems": [{}], "items": {"$ref": "#/prefixItems/" + "1" * 5000}},
        id="ref-index-too-long",
    ),
    pytest.param(
        "ollama/llama3",
        "guided_choice",
        [f"choice-{i}" for i in range(2000)],
        id="guided_choice-too-many",
    ),
]


@pytest.mark.parametrize("route", [OPENAI_ROUTES[0], SGP_ROUTE])
@pytest.mark.parametrize(("model", "field", "value"), REFUSED)
def test_what_cannot_be_checked_in_bounds_is_refused_before_the_upstream(
    api: httpx.Client,
    upstream: Upstream,
    route: str,
    model: str,
    field: str,
    value: Any,
) -> None:
    upstream.handler = answering("x")
    resp, took = timed_post(api, route, {"model": model, "prompt": "hi", "max_tokens": 4, field: value})
    body = resp.json()
    if route == SGP_ROUTE:
        assert resp.status_code == 422, resp.text
        assert [d["loc"] for d in body["detail"]] == [["body", field]]
        message = body["detail"][0]["msg"]
    else:
        assert resp.status_code == 400, resp.text
        assert (body["error"]["param"], body["error"]["type"]) == (field, "invalid_request_error")
        message = body["error"]["message"]
    assert message.startswith(f"'{field}' ")
    assert upstream.received == []
    assert took < 1.0


def test_a_remote_ref_is_refused_and_never_fetched(api: httpx.Client, upstream: Upstream) -> None:
    fetched: list[str] = []

    async def handler(request: web.Request, received: Received) -> web.StreamResponse:
        fetched.append(received.path)
        if received.path.startswith("/schemas/"):
            return web.json_response({"type": "string"})
        return await answering('"x"')(request, received)

    upstream.handler = handler
    schema = {"$ref": f"{upstream.url}/schemas/evil.json"}
    resp, _ = timed_post(
        api,
        "/v1/completions",
        {"model": "anthropic/claude-3-opus-20240229", "prompt": "hi", "max_tokens": 4, "guided_json": schema},
    )
    assert_error(
        resp,
        "/v1/completions",
        status=400,
        type="invalid_request_error",
        param="guided_json",
        code="invalid_value",
        message=(
            f"'guided_json' has a $ref the gateway does not follow ({schema['$ref']!r}): only '#' and '#/...' pointers"
        ),
    )
    assert fetched == []


def test_a_recursive_schema_that_descends_is_still_checked(api: httpx.Client, upstream: Upstream) -> None:
    tree = {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#"}}}, "required": ["kids"]}
    upstream.handler = answering('{"kids": [{"kids": []}, {"kids": [{"kids": []}]}]}')
    resp, _ = timed_post(
        api,
        "/v1/completions",
        {"model": "anthropic/claude-3-opus-20240229", "prompt": "a tree", "max_tokens": 40, "guided_json": tree},
    )
    assert resp.status_code == 200, resp.text
