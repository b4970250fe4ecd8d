"""llama.cpp's and TGI's tokenizer routes, translated to and from vLLM's shapes."""

from __future__ import annotations

import httpx
import pytest

from tests.clients.tokenizer.upstreams import BOS, error_envelope
from tests.helpers.upstreams import Upstream

# -- llama.cpp and TGI: translated to and from vLLM's shapes ---------------------------------------------------


def test_llamacpp_tokenize_is_translated_and_its_context_asked_once(api: httpx.Client, upstream: Upstream) -> None:
    body = {"prompt": "h\u00e1", "add_special_tokens": True, "return_token_strs": True}
    resp = api.post("/m/ll/tiny/tokenize", json=body)
    assert resp.status_code == 200, resp.text
    assert resp.json() == {
        "count": 3,
        "max_model_len": 4096,
        "tokens": [BOS, 104, 225],
        "token_strs": ["\x01", "h", "<0xC3>"],
    }
    tokenize, props = upstream.received
    assert tokenize.path == "/ll/tokenize"
    assert tokenize.json() == {"model": "tiny", "content": "h\u00e1", "add_special": True, "with_pieces": True}
    assert (props.method, props.path) == ("GET", "/ll/props")
    again = api.post("/m/ll/tiny/tokenize", json={"prompt": "h"})
    assert again.json() == {"count": 2, "max_model_len": 4096, "tokens": [BOS, 104], "token_strs": None}
    assert [r.path for r in upstream.received[2:]] == ["/ll/tokenize"]  # the context size is remembered


def test_llamacpp_detokenize_content_becomes_prompt(api: httpx.Client, upstream: Upstream) -> None:
    resp = api.post("/m/ll/tiny/detokenize", json={"tokens": [104, 105]})
    assert resp.status_code == 200, resp.text
    assert resp.json() == {"prompt": "hi"}
    assert upstream.only().json() == {"model": "tiny", "tokens": [104, 105]}


def test_a_llamacpp_server_that_renders_no_conversation_says_so(api: httpx.Client, upstream: Upstream) -> None:
    # A llama-server without /apply-template (an older build, as this one plays): the chat form names the lack.
    chat = {"messages": [{"role": "user", "content": "Hi"}], "add_special_tokens": False}
    message = error_envelope(api.post("/m/ll/tiny/tokenize", json=chat), 404, "tokenizer_not_available")
    assert message == (
        "Provider 'll' has no /tokenize route for a conversation: its server has no route that renders one; "
        "send 'prompt'"
    )
    (render,) = upstream.received
    assert render.path == "/ll/apply-template"
    assert render.json() == {"model": "tiny", "messages": chat["messages"], "add_generation_prompt": True}


def test_tgi_tokenize_is_translated(api: httpx.Client, upstream: Upstream) -> None:
    resp = api.post("/m/tgi/bloom/tokenize", json={"prompt": "ok", "return_token_strs": True})
    assert resp.status_code == 200, resp.text
    assert resp.json() == {"count": 2, "max_model_len": 2048, "tokens": [111, 107], "token_strs": ["o", "k"]}
    assert upstream.received[0].json() == {"inputs": "ok"}
    assert [r.path for r in upstream.received] == ["/tgi/tokenize", "/tgi/info"]


def test_tgi_tokenizes_a_conversation_with_its_chat_tokenize(api: httpx.Client, upstream: Upstream) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    resp = api.post("/m/tgi/bloom/tokenize", json={"messages": messages, "return_token_strs": True})
    assert resp.status_code == 200, resp.text
    text = "<system>Be brief.<user>Hi<assistant>"
    assert resp.json() == {
        "count": len(text),
        "max_model_len": 2048,
        "tokens": [ord(c) for c in text],
        "token_strs": list(text),
    }
    (chat,) = [r for r in upstream.received if r.path != "/tgi/info"]  # the context size: asked once per server
    # "tgi" as the model: another name is a LoRA adapter to TGI's Messages API.
    assert (chat.path, chat.json()) == ("/tgi/chat_tokenize", {"model": "tgi", "messages": messages})
    # What TGI cannot do with a conversation is refused by name, before any call.
    upstream.received.clear()
    for extra in (
        {"add_generation_prompt": False},
        {"continue_final_message": True, "add_generation_prompt": False},
        {"chat_template_kwargs": {"enable_thinking": False}},
        {"add_special_tokens": True},
    ):
        body = {"messages": [*messages, {"role": "assistant", "content": "Hel"}], **extra}
        param = next(iter(extra)) if "continue_final_message" not in extra else "continue_final_message"
        error_envelope(api.post("/m/tgi/bloom/tokenize", json=body), 400, "unsupported_parameter", param)
    assert upstream.received == []


def test_tgi_cannot_leave_out_special_tokens_and_has_no_detokenize(api: httpx.Client, upstream: Upstream) -> None:
    message = error_envelope(
        api.post("/m/tgi/bloom/tokenize", json={"prompt": "ok", "add_special_tokens": False}),
        400,
        "unsupported_parameter",
        param="add_special_tokens",
    )
    assert "'tgi'" in message
    message = error_envelope(api.post("/m/tgi/bloom/detokenize", json={"tokens": [1]}), 404, "tokenizer_not_available")
    assert "'tgi'" in message and "/detokenize" in message
    assert upstream.received == []


@pytest.mark.parametrize("model", ["oa/gpt-3.5-turbo-instruct", "demo/echo"])
@pytest.mark.parametrize("route", ["tokenize", "detokenize", "tokenizer_info"])
def test_providers_without_tokenizer_routes_answer_404(
    api: httpx.Client, upstream: Upstream, model: str, route: str
) -> None:
    body = {"tokenize": {"prompt": "x"}, "detokenize": {"tokens": [1]}}.get(route)
    resp = api.request("GET" if route == "tokenizer_info" else "POST", f"/m/{model}/{route}", json=body)
    message = error_envelope(resp, 404, "tokenizer_not_available")
    assert f"'{model.partition('/')[0]}'" in message
    assert upstream.received == []
