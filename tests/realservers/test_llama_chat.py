"""`/v1/chat/completions` of the two real llama.cpp servers (tests/realservers/conftest.py), directly and through
the gateway, side by side: plain and streamed, with logprobs, and lm-eval's `local-chat-completions` bodies.
Greedy decoding (temperature 0) of the same conversation on the same server answers the same tokens twice;
ids and timestamps differ, and the gateway names the model as the client asked for it.

Providers of the gateway: `ll` (kind llamacpp -> llama-server), `lv` (kind vllm -> llama-server's /v1) and
`py` (kind vllm -> llama-cpp-python's /v1). The tiny GGUF has no chat template: llama-server renders with its
default (ChatML), llama-cpp-python with its own default format; each is compared with itself.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.helpers.servers import GatewayThread

from .conftest import LLAMA_CONTEXT, MODEL, Server

TOKENS = 12
MESSAGES = [
    {"role": "system", "content": "You are a fox."},
    {"role": "user", "content": "# h\u00e9llo w\u00f6rld \u2014 what does the fox say?"},
]
PROVIDERS = [pytest.param("ll", id="llamacpp"), pytest.param("lv", id="vllm-kind"), pytest.param("py", id="python")]


def _server(provider: str, llama_server: Server, llama_cpp_python: Server) -> Server:
    return llama_cpp_python if provider == "py" else llama_server


def _post(client: httpx.Client, url: str, body: dict[str, Any]) -> dict[str, Any]:
    resp = client.post(url, json=body)
    assert resp.status_code == 200, resp.text
    out: dict[str, Any] = resp.json()
    return out


def _stream(client: httpx.Client, url: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    with client.stream("POST", url, json={**body, "stream": True}) as resp:
        assert resp.status_code == 200, resp.read()
        text = resp.read().decode()
    events = [line.removeprefix("data: ") for line in text.split("\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]", events[-3:]
    return [json.loads(e) for e in events[:-1]]


def _pair(
    client: httpx.Client,
    gateway: GatewayThread,
    server: Server,
    provider: str,
    body: dict[str, Any],
    stream: bool = False,
) -> tuple[Any, Any]:
    """(direct, via the gateway) for the same body, after a first call that leaves the conversation in the
    server's prompt cache: llama-server's logprobs from a cached prompt differ from a cold one's in the third
    decimal, so both answers compared come from the cache."""
    _post(client, server.url + "/v1/chat/completions", {**body, "model": MODEL, "max_tokens": 1})
    call = _stream if stream else _post
    direct = call(client, server.url + "/v1/chat/completions", {**body, "model": MODEL})
    via = call(client, gateway.url + "/v1/chat/completions", {**body, "model": f"{provider}/{MODEL}"})
    return direct, via


def _tokens(content: list[dict[str, Any]] | None) -> list[tuple[Any, ...]]:
    """Each token's text, bytes and alternatives (ids and float noise aside)."""
    return [
        (t["token"], t.get("bytes"), [(a["token"], a.get("bytes")) for a in t.get("top_logprobs") or ()])
        for t in content or ()
    ]


def _logprobs(content: list[dict[str, Any]] | None) -> list[float]:
    return [t["logprob"] for t in content or ()] + [a["logprob"] for t in content or () for a in t["top_logprobs"]]


@pytest.mark.parametrize("provider", PROVIDERS)
def test_plain_chat_with_logprobs_is_the_servers(
    client: httpx.Client, gateway: GatewayThread, llama_server: Server, llama_cpp_python: Server, provider: str
) -> None:
    server = _server(provider, llama_server, llama_cpp_python)
    body = {"messages": MESSAGES, "max_tokens": TOKENS, "temperature": 0, "logprobs": True, "top_logprobs": 3}
    direct, via = _pair(client, gateway, server, provider, body)
    assert via["object"] == "chat.completion" and via["model"] == f"{provider}/{MODEL}"
    (d,), (v,) = direct["choices"], via["choices"]
    assert v["message"]["role"] == "assistant"
    assert v["message"]["content"] == d["message"]["content"] and v["message"]["content"]
    assert v["finish_reason"] == d["finish_reason"]
    for field in ("prompt_tokens", "completion_tokens", "total_tokens"):
        assert via["usage"][field] == direct["usage"][field], field
    content = d["logprobs"]["content"]
    assert content and all(t["top_logprobs"] for t in content)
    if provider != "py":  # llama-cpp-python lists the sampled token beside the top 3
        assert all(len(t["top_logprobs"]) == 3 for t in content)
    assert _tokens(v["logprobs"]["content"]) == _tokens(content)
    assert _logprobs(v["logprobs"]["content"]) == pytest.approx(_logprobs(content))


@pytest.mark.parametrize("provider", PROVIDERS)
def test_streamed_chat_with_logprobs_is_the_servers_stream(
    client: httpx.Client, gateway: GatewayThread, llama_server: Server, llama_cpp_python: Server, provider: str
) -> None:
    server = _server(provider, llama_server, llama_cpp_python)
    body = {"messages": MESSAGES, "max_tokens": TOKENS, "temperature": 0, "logprobs": True, "top_logprobs": 2}
    if provider != "py":  # llama-cpp-python's chat stream sends no usage
        body["stream_options"] = {"include_usage": True}
    direct, via = _pair(client, gateway, server, provider, body, stream=True)

    def text(events: list[dict[str, Any]]) -> str:
        return "".join(c["delta"].get("content") or "" for e in events for c in e["choices"])

    def finishes(events: list[dict[str, Any]]) -> list[str]:
        return [c["finish_reason"] for e in events for c in e["choices"] if c.get("finish_reason")]

    def content(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [t for e in events for c in e["choices"] for t in (c.get("logprobs") or {}).get("content") or ()]

    assert all(e["object"] == "chat.completion.chunk" and e["model"] == f"{provider}/{MODEL}" for e in via)
    assert via[0]["choices"][0]["delta"]["role"] == "assistant"
    assert text(via) == text(direct) and text(via)
    assert finishes(via) == finishes(direct) and len(finishes(via)) == 1
    assert _tokens(content(via)) == _tokens(content(direct)) and content(direct)
    assert _logprobs(content(via)) == pytest.approx(_logprobs(content(direct)))
    if provider != "py":
        (usage,) = [e["usage"] for e in direct if e.get("usage")]
        assert via[-1]["choices"] == []
        for field in ("prompt_tokens", "completion_tokens", "total_tokens"):
            assert via[-1]["usage"][field] == usage[field], field

    # The stream says what the plain answer says.
    body.pop("stream_options", None)
    plain = _post(client, gateway.url + "/v1/chat/completions", {**body, "model": f"{provider}/{MODEL}"})
    assert plain["choices"][0]["message"]["content"] == text(via)
    assert _tokens(plain["choices"][0]["logprobs"]["content"]) == _tokens(content(via))


def test_a_stop_string_ends_the_chat_where_the_server_ends_it(
    client: httpx.Client, gateway: GatewayThread, llama_server: Server
) -> None:
    body = {"messages": MESSAGES, "max_tokens": TOKENS, "temperature": 0}
    full = _post(client, gateway.url + "/v1/chat/completions", {**body, "model": f"ll/{MODEL}"})
    text = full["choices"][0]["message"]["content"]
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    assert stop.strip(), text
    direct, via = _pair(client, gateway, llama_server, "ll", {**body, "stop": [stop]})
    d, v = direct["choices"][0], via["choices"][0]
    assert (v["message"]["content"], v["finish_reason"]) == (d["message"]["content"], d["finish_reason"])
    assert stop not in v["message"]["content"] and text.startswith(v["message"]["content"])


def test_lm_eval_local_chat_completions_through_the_model_path(
    client: httpx.Client, gateway: GatewayThread, llama_server: Server
) -> None:
    """`LocalChatCompletion._create_payload` (lm-eval @ 0064c3a0) with its `"type": "text"` on each message,
    to `/m/ll/tiny/v1/chat/completions`, read by its `parse_generations`: what llama-server generates for
    the conversation itself."""
    messages = [{**m, "type": "text"} for m in MESSAGES]
    until = ["\n\n", "Question:"]
    payload = {"messages": messages, "model": f"ll/{MODEL}", "max_tokens": TOKENS, "temperature": 0.0}
    payload |= {"stop": until[:4], "seed": 1234}
    out = _post(client, f"{gateway.url}/m/ll/{MODEL}/v1/chat/completions", payload)
    generations: list[str | None] = [None] * len(out["choices"])
    for choice in out["choices"]:
        generations[choice["index"]] = choice["message"]["content"]
    native = {"messages": MESSAGES, "model": MODEL, "max_tokens": TOKENS, "temperature": 0.0}
    direct = _post(client, llama_server.url + "/v1/chat/completions", native | {"stop": until, "seed": 1234})
    assert generations == [direct["choices"][0]["message"]["content"]]


def test_a_conversations_tokens_are_the_prompt_its_chat_completion_counts(
    client: httpx.Client, gateway: GatewayThread, llama_server: Server
) -> None:
    """vLLM's chat form of /tokenize on llama-server: the conversation rendered by its `/apply-template`, the
    text tokenized by its `/tokenize` with the BOS its chat route adds, so the count is the `prompt_tokens`
    of the same conversation's chat completion, a new turn or a continued message."""
    url = f"{gateway.url}/m/ll/{MODEL}/tokenize"
    continued = [*MESSAGES, {"role": "assistant", "content": "The fox"}]
    for messages, extra in ((MESSAGES, {}), (continued, {"continue_final_message": True})):
        fields = {**extra, "add_generation_prompt": False} if extra else {}
        via = _post(client, url, {"messages": messages, "return_token_strs": True, **fields})
        asked = {"model": MODEL, "messages": messages, "max_tokens": 1, **fields}
        usage = _post(client, llama_server.url + "/v1/chat/completions", asked)["usage"]
        assert via["count"] == len(via["tokens"]) == usage["prompt_tokens"], extra
        rendered = _post(client, llama_server.url + "/apply-template", {"messages": messages, **fields})["prompt"]
        direct = _post(client, llama_server.url + "/tokenize", {"content": rendered, "add_special": True})
        assert via["tokens"] == direct["tokens"] and via["max_model_len"] == LLAMA_CONTEXT
        assert "".join(via["token_strs"][1:]) == rendered  # after the BOS, the template's text
        assert rendered.endswith("The fox") == bool(extra)
    # The client's own `add_special_tokens: false`: the rendered text alone.
    bare = _post(client, url, {"messages": MESSAGES, "add_special_tokens": False})
    assert bare["tokens"] == _post(client, url, {"messages": MESSAGES})["tokens"][1:]
