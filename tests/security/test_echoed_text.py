"""Client text an error quotes is cut at `SHOWN_CHARS` (64) characters, on every route that quotes it.

A body may hold megabytes in one string and a URL 64 KiB in one path segment: an unknown model's 404, a value
outside an enum, a header name, a `response_format` type, a key, batch or file id in the path and a query
parameter each came back whole in the error before, as did a routed model's 250-character name in an upstream
failure (unreachable, an unreadable or short answer) or a provider's refusal. Each answer here is a 4xx naming
the field, or a 502 naming the target, in the route's dialect, a few hundred bytes long; the access log line of
each request stays as small, and distinct unknown models add no metric series. The gateway is served by
uvicorn on a loopback socket, with a SQLite ledger.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Any, Final

import httpx
import pytest

from tests.helpers.accesslog import Lines
from tests.helpers.errors import OPENAI_ROUTES, PAIS_ROUTE, SGP_ROUTE, assert_field_error
from tests.helpers.recordings import fixture_bytes
from tests.helpers.servers import GatewayThread, free_port, serve_config
from tests.helpers.upstreams import Handler, Upstream, reply, reply_sse
from tests.helpers.waiting import wait_until
from wire.errors import SHOWN_CHARS

from .conftest import post

KEY: Final = "gk-sec-echo-7d21"
ADMIN: Final = "adm-sec-echo-40b9"
MiB: Final = 1024 * 1024
SMALL: Final = 2048  # an answer or log line quoting a cut text, with room to spare
LONG: Final = 200  # an unknown model under the 256-character cap, longer than an error quotes
ROUTED: Final = 245  # a `vendor/model` path's model part: 250 characters in all, under the 256 cap
SEGMENT: Final = 40_000  # a path segment well inside the 64 KiB a request's head may hold

CONFIG: Final = """
server: {{host: 127.0.0.1, port: 0}}
admin: {{key: "{admin}"}}
retries: {{attempts: 1}}
ledger: {{url: "sqlite:///{db}", flush_ms: 100}}
keys:
  - {{name: eval, key: "{key}"}}
providers:
  demo: {{kind: fake, models: [text]}}
  sh: {{kind: vllm, base_url: "{url}/v1", discover: false}}
  ol: {{kind: ollama, base_url: "{url}", discover: false}}
  dead: {{kind: vllm, base_url: "http://127.0.0.1:{dead}/v1", discover: false, max_concurrency: 4}}
  bed: {{kind: bedrock, api_key: "AKIDEXAMPLE:secret", region: us-east-1, base_url: "{url}/bed"}}
models:
  - {{name: fast, targets: [{{model: demo/text}}]}}
"""


@pytest.fixture(scope="module")
def echo_gateway(upstream_server: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayThread]:
    tmp = tmp_path_factory.mktemp("echo")
    db, url = tmp / "ledger.db", upstream_server.url
    config = CONFIG.format(admin=ADMIN, key=KEY, db=db, url=url, dead=free_port())  # nothing listens there
    with serve_config(tmp, config) as gw:
        yield gw


@pytest.fixture
def http(echo_gateway: GatewayThread) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=echo_gateway.url, trust_env=False, timeout=30) as c:
        yield c


def _short(resp: httpx.Response) -> None:
    assert len(resp.content) < SMALL, (resp.status_code, resp.content[:300])


def _small(resp: httpx.Response, status: int) -> None:
    _short(resp)
    assert resp.status_code == status, resp.text
    assert "..." in resp.text, resp.text  # it says the text was cut


def _lines_small(access: Lines) -> None:
    # The line is written once the answer is sent: the client may read it before the gateway writes it.
    with contextlib.suppress(AssertionError):
        wait_until(lambda: access.raw, timeout=10)
    assert access.raw, "no access log line"
    assert max(len(line) for line in access.raw) < SMALL, max(access.raw, key=len)[:300]


@pytest.mark.parametrize("route", [*OPENAI_ROUTES, SGP_ROUTE, PAIS_ROUTE])
def test_an_unknown_models_404_quotes_it_cut(http: httpx.Client, access: Lines, route: str) -> None:
    model = "nowhere-" + "m" * LONG
    resp = post(http, route, {"model": model, "prompt": "hi"}, key=KEY)
    _small(resp, 404)
    assert model not in resp.text and model[:SHOWN_CHARS] in resp.text
    if route in OPENAI_ROUTES:
        assert resp.json()["error"]["param"] == "model"
    _lines_small(access)


@pytest.mark.parametrize("route", [OPENAI_ROUTES[0], SGP_ROUTE])
def test_a_megabyte_model_is_a_small_400_naming_it(http: httpx.Client, access: Lines, route: str) -> None:
    resp = post(http, route, {"model": "m" * MiB, "prompt": "hi"}, key=KEY)
    _short(resp)
    assert_field_error(resp, route, "model")
    _lines_small(access)


@pytest.mark.parametrize("route", [OPENAI_ROUTES[0], SGP_ROUTE, "/v1/chat/completions"])
def test_a_huge_value_outside_an_enum_is_quoted_cut(http: httpx.Client, access: Lines, route: str) -> None:
    body: dict[str, Any] = {"model": "fast", "reasoning_effort": "x" * MiB}
    body.update({"messages": [{"role": "user", "content": "hi"}]} if "chat" in route else {"prompt": "hi"})
    resp = post(http, route, body, key=KEY)
    _short(resp)
    assert_field_error(resp, route if "chat" not in route else OPENAI_ROUTES[0], "reasoning_effort")
    assert "x" * SHOWN_CHARS + "..." in resp.text
    _lines_small(access)


def test_a_huge_tool_choice_is_quoted_cut(http: httpx.Client) -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    body = {"model": "fast", "messages": [{"role": "user", "content": "hi"}], "tools": tools, "tool_choice": "x" * MiB}
    resp = post(http, "/v1/chat/completions", body, key=KEY)
    _short(resp)
    assert_field_error(resp, OPENAI_ROUTES[0], "tool_choice")
    assert "x" * SHOWN_CHARS + "..." in resp.text


@pytest.mark.parametrize("name", ["proxy-" + "a" * MiB, "a b" + "c" * MiB])
def test_a_refused_extra_header_is_named_cut(http: httpx.Client, name: str) -> None:
    body = {"model": "fast", "prompt": "hi", "inference_extra_headers": {name: "v"}}
    resp = post(http, "/v1/completions", body, key=KEY)
    _short(resp)
    assert_field_error(resp, "/v1/completions", "inference_extra_headers")
    _small(resp, 400)


@pytest.mark.parametrize(
    ("route", "model", "param"),
    [("/v1/completions", "ol/m", "response_format"), ("/v1/chat/completions", "sh/m", "response_format.type")],
)
def test_an_unknown_response_format_type_is_quoted_cut(http: httpx.Client, route: str, model: str, param: str) -> None:
    body: dict[str, Any] = {"model": model, "response_format": {"type": "t" * MiB}}
    body.update({"messages": [{"role": "user", "content": "hi"}]} if "chat" in route else {"prompt": "hi"})
    resp = post(http, route, body, key=KEY)
    _short(resp)
    assert_field_error(resp, "/v1/completions", param)
    _small(resp, 400)


def test_a_scoped_routes_mismatched_model_is_quoted_cut(http: httpx.Client) -> None:
    given = "g" * MiB
    resp = post(http, "/m/fast/v1/completions", {"model": given, "prompt": "hi"}, key=KEY)
    _small(resp, 400)
    assert resp.json()["error"]["code"] == "model_mismatch"
    # The path's own model, as long as a URL holds, against the body's on a tokenizer route.
    resp = post(http, f"/m/{'p' * SEGMENT}/tokenize", {"model": given, "prompt": "hi"}, key=KEY)
    _small(resp, 400)
    assert resp.json()["error"]["param"] == "model"


@pytest.mark.parametrize(
    ("method", "path", "key"),
    [
        ("GET", "/v1/batches/{}", KEY),
        ("POST", "/v1/batches/{}/cancel", KEY),
        ("GET", "/v1/files/{}", KEY),
        ("DELETE", "/v1/files/{}", KEY),
        ("GET", "/admin/batches/{}", ADMIN),
        ("DELETE", "/admin/keys/{}", ADMIN),
        ("POST", "/admin/keys/{}/rotate", ADMIN),
        ("POST", "/admin/providers/{}/replicas/0/drain", ADMIN),
    ],
)
def test_a_huge_id_in_the_path_is_a_small_404(http: httpx.Client, method: str, path: str, key: str) -> None:
    resp = http.request(method, path.format("i" * SEGMENT), headers={"authorization": f"Bearer {key}"})
    _small(resp, 404)


def test_a_huge_input_file_id_is_a_small_404(http: httpx.Client) -> None:
    body = {"input_file_id": "f" * MiB, "endpoint": "/v1/completions", "completion_window": "24h"}
    resp = http.post("/v1/batches", json=body, headers={"authorization": f"Bearer {KEY}"})
    _small(resp, 404)


def test_a_path_parameter_of_the_wrong_type_is_a_small_404(http: httpx.Client) -> None:
    path = f"/admin/providers/sh/replicas/{'9' * 20}{'x' * SEGMENT}/drain"
    resp = http.post(path, headers={"authorization": f"Bearer {ADMIN}"})
    assert (resp.status_code, len(resp.content) < SMALL) == (404, True), resp.content[:300]


def _form(headers: str, value: bytes) -> bytes:
    return b"--b\r\n" + headers.encode() + b"\r\n\r\n" + value + b"\r\n--b--\r\n"


@pytest.mark.parametrize(
    "form",
    [
        # A field longer than a text field may be, under a name as long as the parser takes (4 KiB a header).
        _form(f'Content-Disposition: form-data; name="{"n" * 3500}"', b"v" * 5000),
        # A text field in a charset no codec has, named as long.
        _form(
            f'Content-Disposition: form-data; name="purpose"\r\nContent-Type: text/plain; charset={"c" * 3500}', b"b"
        ),
    ],
    ids=["name", "charset"],
)
def test_an_upload_forms_field_name_and_charset_are_quoted_cut(http: httpx.Client, form: bytes) -> None:
    headers = {"authorization": f"Bearer {KEY}", "content-type": "multipart/form-data; boundary=b"}
    resp = http.post("/v1/files", content=form, headers=headers)
    _small(resp, 400)


@pytest.mark.parametrize("param", ["from", "to", "by", "format", "day"])
def test_a_huge_usage_query_parameter_is_a_small_400_naming_it(http: httpx.Client, param: str) -> None:
    resp = http.get("/admin/usage", params={param: "q" * SEGMENT}, headers={"authorization": f"Bearer {ADMIN}"})
    _small(resp, 400)
    assert resp.json()["error"]["param"] == param


def _series(http: httpx.Client) -> set[str]:
    """Every series `/metrics` lists: each sample's name and labels, without its value."""
    text = http.get("/metrics").text
    return {re.sub(r" \S+$", "", line) for line in text.splitlines() if line and not line.startswith("#")}


def test_distinct_unknown_models_add_no_metric_series(http: httpx.Client) -> None:
    models = [f"nowhere-{i}-" + "m" * LONG for i in range(20)]
    assert post(http, "/v1/completions", {"model": models[0], "prompt": "hi"}, key=KEY).status_code == 404
    before = _series(http)
    for model in models[1:]:
        assert post(http, "/v1/completions", {"model": model, "prompt": "hi"}, key=KEY).status_code == 404
    after = _series(http)
    assert after == before
    assert not any("nowhere-" in s for s in after)


# A model that routes, `vendor/<245 characters>`, is named by every error about its target: the route key
# (`vendor/model`) is quoted cut like any other client text, on each route that reaches an upstream.
ROUTES_TO_UPSTREAMS: Final = (*OPENAI_ROUTES, SGP_ROUTE, PAIS_ROUTE, "/v1/chat/completions", "/tokenize")


def _routed(vendor: str, tag: str) -> str:
    """A model name of 250 characters that routes to `vendor`; `tag` keeps each test's target its own, so
    that one test's failure does not leave another's target cooling."""
    return f"{vendor}/{tag}-" + "m" * (ROUTED - len(tag) - 1)


def _body(route: str, model: str, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, **extra}
    body.update({"messages": [{"role": "user", "content": "hi"}]} if "chat" in route else {"prompt": "hi"})
    return body


def _quoted_cut(resp: httpx.Response, quoted: str, status: int) -> None:
    _small(resp, status)
    assert quoted[:SHOWN_CHARS] + "..." in resp.text, resp.text
    assert quoted[: SHOWN_CHARS + 1] not in resp.text, resp.text


@pytest.mark.parametrize("route", ROUTES_TO_UPSTREAMS)
def test_an_unreachable_targets_502_quotes_the_model_cut(http: httpx.Client, access: Lines, route: str) -> None:
    model = _routed("dead", route.replace("/", "."))
    resp = post(http, route, _body(route, model), key=KEY)
    _quoted_cut(resp, model, 502)
    assert "could not be reached" in resp.text
    _lines_small(access)
    if route != "/tokenize":  # the target now cools: the next request is refused before any call
        again = post(http, route, _body(route, model), key=KEY)
        _short(again)
        assert again.status_code == 503 and model[:SHOWN_CHARS] not in again.text, again.text


@pytest.mark.parametrize(
    ("route", "handler", "stream", "said"),
    [
        (OPENAI_ROUTES[0], reply(b"not json"), False, "sent an invalid"),
        ("/v1/chat/completions", reply(b"not json"), False, "sent an invalid"),
        (SGP_ROUTE, reply_sse([]), True, "ended the stream early"),
        (PAIS_ROUTE, reply(fixture_bytes("openai/completion_davinci002.json")), False, "answered 1 choice(s)"),
    ],
    ids=["unreadable", "unreadable-chat", "ended-early", "ignored-n"],
)
def test_a_failed_answers_502_quotes_the_model_cut(
    http: httpx.Client, upstream: Upstream, route: str, handler: Handler, stream: bool, said: str
) -> None:
    upstream.handler = handler
    model = _routed("sh", route.replace("/", ".") + str(stream))
    n = 2 if said.startswith("answered") else 1
    resp = post(http, route, _body(route, model, stream=stream, n=n), key=KEY)
    _quoted_cut(resp, model, 502)
    assert said in resp.text


@pytest.mark.parametrize(
    ("model", "extra", "param"),
    [
        (_routed("demo", "fake"), {"max_tokens": 10**6}, "max_tokens"),  # more than the fake model writes
        (_routed("bed", "mistral"), {"top_k": 5}, "top_k"),  # Bedrock takes top_k for Claude and Nova only
    ],
    ids=["fake", "bedrock"],
)
def test_a_targets_refusal_quotes_the_model_cut(
    http: httpx.Client, model: str, extra: dict[str, Any], param: str
) -> None:
    resp = post(http, OPENAI_ROUTES[0], _body(OPENAI_ROUTES[0], model, **extra), key=KEY)
    _quoted_cut(resp, model.partition("/")[2], 400)  # the provider's own model name, without the vendor
    assert resp.json()["error"]["param"] == param


def test_a_huge_priority_header_is_quoted_cut(http: httpx.Client) -> None:
    # Read on every request once a server has max_concurrency (`dead`'s): the fair queue's priority.
    headers = {"x-gateway-priority": "p" * 4000}
    resp = post(http, OPENAI_ROUTES[0], _body(OPENAI_ROUTES[0], "fast"), key=KEY, headers=headers)
    _small(resp, 400)
    assert "p" * SHOWN_CHARS + "..." in resp.text and "p" * (SHOWN_CHARS + 1) not in resp.text
