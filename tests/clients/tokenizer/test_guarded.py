"""The tokenizer routes' auth, limits and hostile paths."""

from __future__ import annotations

import http.client

import httpx
import pytest

from tests.clients.tokenizer.upstreams import AUTH, BASE, FULL_KEY, MODEL, NARROW_KEY, SLOW_KEY, error_envelope
from tests.helpers.servers import GatewayThread
from tests.helpers.upstreams import Upstream

# -- auth, limits, hostile paths --------------------------------------------------------------------------------


def test_tokenizer_routes_need_a_key_and_respect_its_globs(gateway: GatewayThread, upstream: Upstream) -> None:
    with httpx.Client(base_url=gateway.url, trust_env=False, timeout=15) as bare:
        for path in ("/tokenize", f"{BASE}/tokenize"):
            error_envelope(bare.post(path, json={"prompt": "x"}), 401, "missing_api_key", param=None)
        narrow = {"authorization": f"Bearer {NARROW_KEY}"}
        message = error_envelope(
            bare.post(f"{BASE}/tokenize", json={"prompt": "x"}, headers=narrow), 403, "model_not_allowed"
        )
        assert MODEL in message
        error_envelope(
            bare.get("/tokenizer_info", headers=narrow), 403, "model_not_allowed"
        )  # the default is not allowed either
        ok = bare.post("/m/ll/tiny/detokenize", json={"tokens": [104]}, headers=narrow)
        assert ok.status_code == 200, ok.text
    assert [r.path for r in upstream.received] == ["/ll/detokenize"]


def test_tokenizer_requests_count_against_the_request_rate(gateway: GatewayThread, upstream: Upstream) -> None:
    with httpx.Client(base_url=gateway.url, trust_env=False, timeout=15) as bare:
        slow = {"authorization": f"Bearer {SLOW_KEY}"}
        first = bare.post(f"{BASE}/tokenize", json={"prompt": "x"}, headers=slow)
        assert first.status_code == 200, first.text
        assert first.headers["x-ratelimit-limit-requests"] == "1"
        second = bare.post(f"{BASE}/detokenize", json={"tokens": [1]}, headers=slow)
        error_envelope(second, 429, "rate_limit_exceeded", param=None)
        assert int(second.headers["retry-after"]) > 0
    assert len(upstream.received) == 1


def test_tokenizer_requests_count_against_the_teams_request_rate(gateway: GatewayThread, upstream: Upstream) -> None:
    with httpx.Client(base_url=gateway.url, trust_env=False, timeout=15) as bare:
        one, two = ({"authorization": f"Bearer gk-tok-crew-{i}"} for i in (1, 2))
        assert bare.post(f"{BASE}/tokenize", json={"prompt": "x"}, headers=one).status_code == 200
        assert bare.post(f"{BASE}/detokenize", json={"tokens": [1]}, headers=two).status_code == 200
        third = bare.post(f"{BASE}/tokenize", json={"prompt": "x"}, headers=one)
        error_envelope(third, 429, "rate_limit_exceeded", param=None)
        assert third.headers["x-gateway-team"] == "crew"
        assert third.headers["x-ratelimit-limit-requests"] == "2"
    assert len(upstream.received) == 2


@pytest.mark.parametrize(
    "raw_path",
    [
        pytest.param("/m/vl/../oa/x/tokenize", id="dot-dot"),
        pytest.param("/m/vl/%2E%2E/oa/x/tokenize", id="encoded-dot-dot"),
        pytest.param("/m/vl%2F..%2Foa/tokenize", id="encoded-slash-dot-dot"),
        pytest.param("/m/vl/a%00b/tokenize", id="nul"),
        pytest.param("/m/vl/a%0D%0Ax-injected:%201/tokenize", id="crlf"),
        pytest.param("/m/vl/a%3Fb/tokenize", id="question-mark"),
        pytest.param("/m//tokenize", id="empty"),
        pytest.param("/m/vl/a%5Cb/v1/completions", id="backslash-completions"),
    ],
)
def test_a_hostile_model_in_the_path_is_a_400(gateway: GatewayThread, upstream: Upstream, raw_path: str) -> None:
    # http.client sends the path as written: no client-side dot-segment removal or re-encoding.
    conn = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=15)
    try:
        conn.request("POST", raw_path, body=b'{"prompt": "x"}', headers={**AUTH, "content-type": "application/json"})
        resp = conn.getresponse()
        status, body = resp.status, resp.read()
    finally:
        conn.close()
    assert status == 400, body
    err = httpx.Response(400, content=body).json()["error"]
    assert err["param"] == "model" and err["type"] == "invalid_request_error"
    assert upstream.received == []


def test_unknown_path_under_the_prefix_is_a_404_envelope(api: httpx.Client) -> None:
    error_envelope(api.post(f"{BASE}/v1/embeddings", json={}), 404, "not_found", param=None)


def test_wrong_method_is_a_405(api: httpx.Client) -> None:
    assert api.get(f"{BASE}/tokenize").status_code == 405
    assert api.post("/tokenizer_info").status_code == 405


def test_bad_bodies_are_400s_naming_the_field(api: httpx.Client, upstream: Upstream) -> None:
    error_envelope(api.post(f"{BASE}/tokenize", json={"prompt": 5}), 400, "invalid_value", param="prompt")
    error_envelope(api.post(f"{BASE}/detokenize", json={"tokens": [-1]}), 400, "invalid_value", param="tokens")
    error_envelope(api.post(f"{BASE}/tokenize", json={"prompt": "x", "max": 1}), 400, "unknown_parameter", param="max")
    error_envelope(api.post(f"{BASE}/tokenize", json={"prompt": "x", "model": "vl/other"}), 400, "model_mismatch")
    assert upstream.received == []


@pytest.mark.parametrize(
    "tokens", ["[-1]", "[9223372036854775808]", "[1, true]", "[1, 2.5]", "[2.0]", "[null]", "[[1]]"]
)
def test_an_id_that_is_no_token_id_is_a_400_naming_tokens(api: httpx.Client, upstream: Upstream, tokens: str) -> None:
    # Written as text: an id past 64 bits or a whole float must reach the gateway as sent.
    resp = api.post(f"{BASE}/detokenize", content=b'{"tokens": %s}' % tokens.encode())
    error_envelope(resp, 400, "invalid_value", param="tokens")
    assert upstream.received == []


def test_token_lists_past_the_cap_are_refused_before_any_upstream_call(api: httpx.Client, upstream: Upstream) -> None:
    # caps.detokenize_tokens (1 Mi by default): one more id is a 400 naming `tokens`, however small the body
    # (about 2 MiB here, well under the 8 MiB body cap that alone bounded it).
    body = b'{"tokens": [' + b",".join([b"7"] * (1024 * 1024 + 1)) + b"]}"
    for path in ("/detokenize", f"{BASE}/detokenize"):
        resp = api.post(path, content=body, headers={"content-type": "application/json"})
        message = error_envelope(resp, 400, "invalid_value", param="tokens")
        assert "caps.detokenize_tokens" in message
    # /tokenize's `prompt` is text, as vLLM's: a token-id list there is refused as it always was.
    error_envelope(api.post(f"{BASE}/tokenize", json={"prompt": [7] * 10}), 400, "invalid_value", param="prompt")
    assert upstream.received == []


def test_text_past_the_cap_is_refused_before_any_upstream_call(api: httpx.Client, upstream: Upstream) -> None:
    # caps.tokenize_chars (4 Mi by default): one more character of text is a 400 naming the field that holds
    # it, before the upstream tokenizes any of it (the 8 MiB body cap alone bounded it).
    cap = 4 * 1024 * 1024
    for path in ("/tokenize", f"{BASE}/tokenize"):
        message = error_envelope(api.post(path, json={"prompt": "a" * (cap + 1)}), 400, "invalid_value", "prompt")
        assert "caps.tokenize_chars" in message and f"holds {cap + 1} characters" in message
    # The chat form: its messages' text together, as the server's template renders all of it.
    half = "a" * (cap // 2)
    messages = [
        {"role": "system", "content": half},
        {"role": "user", "content": [{"type": "text", "text": half + "b"}]},
    ]
    resp = api.post(f"{BASE}/tokenize", json={"messages": messages})
    assert "caps.tokenize_chars" in error_envelope(resp, 400, "invalid_value", param="messages")
    assert upstream.received == []


@pytest.mark.parametrize("header", ["authorization", "x-api-key"])
@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        pytest.param("POST", f"{BASE}/tokenize", b'{"prompt": "x"}', id="scoped-tokenize"),
        pytest.param("POST", "/tokenize", b'{"prompt": "x"}', id="bare-tokenize"),
        pytest.param("GET", f"{BASE}/tokenizer_info", b"", id="scoped-tokenizer-info"),
        pytest.param("POST", "/v1/completions", b'{"model": "%s", "prompt": "x"}' % MODEL.encode(), id="completions"),
    ],
)
def test_a_key_header_sent_on_two_lines_is_one_value_on_every_route(
    gateway: GatewayThread, upstream: Upstream, header: str, method: str, path: str, body: bytes
) -> None:
    # Two lines of one header are one value, joined by a comma (RFC 9110 5.3), and no key reads like that:
    # which line would count, and so which key's globs and limits, is not the gateway's to guess.
    value = "Bearer {}" if header == "authorization" else "{}"
    conn = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=15)
    try:
        conn.putrequest(method, path)
        conn.putheader(header, value.format(NARROW_KEY))
        conn.putheader(header, value.format(FULL_KEY))
        conn.putheader("content-type", "application/json")
        conn.putheader("content-length", str(len(body)))
        conn.endheaders(body)
        resp = conn.getresponse()
        status, answer = resp.status, resp.read()
    finally:
        conn.close()
    assert status == 401, answer
    assert upstream.received == []


def test_a_conversations_free_form_fields_are_held_to_the_nesting_cap(api: httpx.Client, upstream: Upstream) -> None:
    # caps.json_depth (64 here) bounds the fields the typed decoder does not: on /tokenize as on the chat route.
    deep: object = "x"
    for _ in range(70):
        deep = {"a": deep}
    chat = {"messages": [{"role": "user", "content": "Hi"}]}
    tool = {"type": "function", "function": {"name": "f", "parameters": deep}}
    for extra, param in (({"chat_template_kwargs": {"k": deep}}, "chat_template_kwargs"), ({"tools": [tool]}, "tools")):
        on_chat = api.post(f"{BASE}/v1/chat/completions", json={**chat, **extra})
        error_envelope(on_chat, 400, "too_deeply_nested", param=param)
        error_envelope(api.post(f"{BASE}/tokenize", json={**chat, **extra}), 400, "too_deeply_nested", param=param)
    assert upstream.received == []
