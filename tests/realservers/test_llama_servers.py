"""The gateway in front of two real llama.cpp servers (tests/realservers/conftest.py): what a client gets
directly from the server and through the gateway, side by side, with the bodies lm-eval's `local-completions`
sends. Greedy decoding (temperature 0) of the same model on the same server answers the same tokens twice.

Providers of the gateway: `ll` (llamacpp -> llama-server `/completion`), `lv` (vllm -> llama-server
`/v1/completions`), `py` (vllm -> llama-cpp-python `/v1/completions`).
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from gateway.ops import accesslog
from tests.helpers.clients import sse_data
from tests.helpers.servers import GatewayThread
from tests.helpers.waiting import wait_until

from .conftest import LLAMA_CONTEXT, MODEL, Server

PROMPT = "# h\u00e9llo w\u00f6rld \u2014 \u00fcn\u00efcode \u2713"
# Letters the tiny vocabulary never saw: byte tokens, several of them pieces of one character.
RARE = "# \u0127\u00e9llo \u0175\u00f6rld \u2014 \u016bn\u00efcode \u2714"
TOKENS = 12


def _post(client: httpx.Client, url: str, body: dict[str, Any], status: int = 200) -> dict[str, Any]:
    resp = client.post(url, json=body)
    assert resp.status_code == status, resp.text
    out: dict[str, Any] = resp.json()
    return out


def _gw(client: httpx.Client, gateway: GatewayThread, body: dict[str, Any], status: int = 200) -> dict[str, Any]:
    return _post(client, gateway.url + "/v1/completions", body, status)


def _stream(client: httpx.Client, url: str, body: dict[str, Any], done: bool = True) -> list[dict[str, Any]]:
    """The events of a stream; `done`: it ends with `[DONE]` (OpenAI's routes; llama-server's /completion not)."""
    with client.stream("POST", url, json={**body, "stream": True}) as resp:
        assert resp.status_code == 200, resp.read()
        text = resp.read().decode()
    events = [e for e in (line.removeprefix("data: ") for line in text.split("\n") if line.startswith("data: "))]
    if done:
        assert events[-1] == "[DONE]", events[-3:]
        events = events[:-1]
    return [json.loads(e) for e in events]


def _text(events: list[dict[str, Any]]) -> str:
    return "".join(c["text"] for e in events for c in e.get("choices", []))


# -- plain text, streams, stops, token-id prompts ----------------------------------------------------------


def test_plain_text_matches_each_server(
    client: httpx.Client, gateway: GatewayThread, llama_server: Server, llama_cpp_python: Server
) -> None:
    native = _post(client, llama_server.url + "/completion", {"prompt": PROMPT, "n_predict": TOKENS, "temperature": 0})
    body = {"prompt": PROMPT, "max_tokens": TOKENS, "temperature": 0}
    via_ll = _gw(client, gateway, {**body, "model": f"ll/{MODEL}"})
    assert via_ll["choices"][0]["text"] == native["content"]
    assert via_ll["choices"][0]["finish_reason"] == "length"
    assert via_ll["usage"]["prompt_tokens"] == native["tokens_evaluated"]
    assert via_ll["usage"]["completion_tokens"] == native["tokens_predicted"] == TOKENS
    for server, provider in ((llama_server, "lv"), (llama_cpp_python, "py")):
        direct = _post(client, server.url + "/v1/completions", {**body, "model": MODEL})
        via = _gw(client, gateway, {**body, "model": f"{provider}/{MODEL}"})
        assert via["choices"][0]["text"] == direct["choices"][0]["text"], provider
        assert via["choices"][0]["finish_reason"] == direct["choices"][0]["finish_reason"], provider
        assert via["usage"]["prompt_tokens"] == direct["usage"]["prompt_tokens"], provider
        assert via["usage"]["completion_tokens"] == direct["usage"]["completion_tokens"], provider


@pytest.mark.parametrize("provider", ["ll", "lv", "py"])
def test_a_stream_says_what_the_servers_stream_says(
    client: httpx.Client, gateway: GatewayThread, llama_server: Server, llama_cpp_python: Server, provider: str
) -> None:
    body = {"prompt": PROMPT, "max_tokens": TOKENS, "temperature": 0}
    via = _stream(client, gateway.url + "/v1/completions", {**body, "model": f"{provider}/{MODEL}"})
    finishes = [c["finish_reason"] for e in via for c in e["choices"] if c["finish_reason"]]
    if provider == "ll":
        native = {"prompt": PROMPT, "n_predict": TOKENS, "temperature": 0}
        events = _stream(client, llama_server.url + "/completion", native, done=False)
        assert _text(via) == "".join(e["content"] for e in events)
        assert finishes == ["length"] and events[-1]["stop_type"] == "limit"
    else:
        server = llama_server if provider == "lv" else llama_cpp_python
        events = _stream(client, server.url + "/v1/completions", {**body, "model": MODEL})
        assert _text(via) == _text(events)
        assert finishes == [c["finish_reason"] for e in events for c in e["choices"] if c["finish_reason"]]


@pytest.mark.parametrize("provider", ["ll", "lv", "py"])
def test_a_stop_string_ends_the_text_where_the_server_ends_it(
    client: httpx.Client, gateway: GatewayThread, llama_server: Server, llama_cpp_python: Server, provider: str
) -> None:
    base = {"model": f"{provider}/{MODEL}", "prompt": PROMPT, "max_tokens": TOKENS, "temperature": 0}
    full = _gw(client, gateway, base)["choices"][0]["text"]
    stop = full[len(full) // 2 : len(full) // 2 + 2]
    assert stop.strip(), full
    via = _gw(client, gateway, {**base, "stop": [stop]})["choices"][0]
    if provider == "ll":
        direct = _post(
            client,
            llama_server.url + "/completion",
            {"prompt": PROMPT, "n_predict": TOKENS, "temperature": 0, "stop": [stop]},
        )
        assert (via["text"], via["finish_reason"]) == (direct["content"], "stop")
    else:
        server = llama_server if provider == "lv" else llama_cpp_python
        direct = _post(client, server.url + "/v1/completions", {**base, "model": MODEL, "stop": [stop]})
        answer = direct["choices"][0]
        assert (via["text"], via["finish_reason"]) == (answer["text"], answer["finish_reason"])
    assert stop not in via["text"] and full.startswith(via["text"])


def test_token_id_prompts_match_the_server(client: httpx.Client, gateway: GatewayThread, llama_server: Server) -> None:
    ids = _post(client, llama_server.url + "/tokenize", {"content": PROMPT, "add_special": True})["tokens"]
    direct = _post(client, llama_server.url + "/completion", {"prompt": ids, "n_predict": TOKENS, "temperature": 0})
    for provider in ("ll", "lv"):
        body = {"model": f"{provider}/{MODEL}", "prompt": ids, "max_tokens": TOKENS, "temperature": 0}
        via = _gw(client, gateway, body)
        assert via["choices"][0]["text"] == direct["content"], provider


# -- tokenization --------------------------------------------------------------------------------------------


def test_tokenize_and_detokenize_match_llama_server(
    client: httpx.Client, gateway: GatewayThread, llama_server: Server
) -> None:
    direct = _post(client, llama_server.url + "/tokenize", {"content": PROMPT, "with_pieces": True})["tokens"]
    via = _post(
        client,
        gateway.url + f"/m/ll/{MODEL}/tokenize",
        {"prompt": PROMPT, "add_special_tokens": False, "return_token_strs": True},
    )
    assert via["tokens"] == [t["id"] for t in direct]
    assert via["count"] == len(direct) and via["max_model_len"] == LLAMA_CONTEXT
    text = _post(client, gateway.url + f"/m/ll/{MODEL}/detokenize", {"tokens": via["tokens"]})
    assert text == {"prompt": PROMPT}


def test_lm_eval_discovers_the_tokenizer_of_a_llamacpp_provider(
    client: httpx.Client, gateway: GatewayThread, llama_server: Server
) -> None:
    """lm-eval's `check_remote_tokenizer_support` and `RemoteTokenizer` (lm_eval/utils.py), from the base URL
    `/m/ll/tiny/v1/completions`: /tokenizer_info must have `eos_token`, /tokenize must answer a list."""
    server_base = f"{gateway.url}/m/ll/{MODEL}"
    info = client.get(f"{server_base}/tokenizer_info")
    assert info.status_code == 200, info.text
    props = client.get(llama_server.url + "/props").json()
    assert info.json()["eos_token"] == props["eos_token"] == "</s>"
    assert info.json()["bos_token"] == props["bos_token"] == "<s>"
    eos = _post(client, f"{server_base}/tokenize", {"prompt": "</s>", "add_special_tokens": False})["tokens"]
    direct = _post(client, llama_server.url + "/tokenize", {"content": "</s>", "parse_special": True})["tokens"]
    assert eos == direct and len(eos) == 1
    same = client.get(f"{gateway.url}/tokenizer_info", params={"model": f"ll/{MODEL}"})
    assert same.json() == info.json()


def test_vllm_provider_before_llama_server_says_so_instead_of_answering_empty(
    client: httpx.Client, gateway: GatewayThread, llama_server: Server
) -> None:
    # Directly, llama-server answers vLLM's /tokenize body with no tokens (it reads only `content`).
    assert _post(client, llama_server.url + "/tokenize", {"model": MODEL, "prompt": PROMPT}) == {"tokens": []}
    err = _post(client, gateway.url + f"/m/lv/{MODEL}/tokenize", {"prompt": PROMPT}, 502)["error"]
    assert err["code"] == "invalid_upstream_response"
    missing = client.get(gateway.url + f"/m/lv/{MODEL}/tokenizer_info")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "tokenizer_not_available"


# -- logprobs ------------------------------------------------------------------------------------------------


def test_llama_server_v1_logprobs_are_translated(
    client: httpx.Client, gateway: GatewayThread, llama_server: Server
) -> None:
    body = {"prompt": PROMPT, "max_tokens": TOKENS, "temperature": 0, "logprobs": 5}
    direct = _post(client, llama_server.url + "/v1/completions", {**body, "model": MODEL})["choices"][0]
    content = direct["logprobs"]["content"]
    via = _gw(client, gateway, {**body, "model": f"lv/{MODEL}"})["choices"][0]
    lp = via["logprobs"]
    # llama-server sends a token that is an unfinished character with the next one: fewer entries than tokens.
    assert len(lp["tokens"]) == len(content) <= TOKENS
    assert lp["token_logprobs"] == pytest.approx([c["logprob"] for c in content])
    # Every alternative the server listed, none collapsed into another.
    assert [len(t) for t in lp["top_logprobs"]] == [len(c["top_logprobs"]) for c in content]
    assert via["text"] == direct["text"]
    _check_offsets(lp, PROMPT, via["text"], [bytes(c["bytes"]) for c in content])


@pytest.mark.parametrize("provider", ["ll", "lv"])
def test_streamed_logprobs_are_the_answers_logprobs(
    client: httpx.Client, gateway: GatewayThread, provider: str
) -> None:
    body = {"model": f"{provider}/{MODEL}", "prompt": RARE, "max_tokens": TOKENS, "temperature": 0, "logprobs": 3}
    whole = _gw(client, gateway, body)["choices"][0]["logprobs"]
    events = _stream(client, gateway.url + "/v1/completions", body)
    parts = [c["logprobs"] for e in events for c in e["choices"] if c.get("logprobs")]
    for field in ("tokens", "text_offset"):
        assert [x for p in parts for x in p[field]] == whole[field], field
    # The same alternatives (the server's floats may differ in the last digits between its two paths).
    assert [list(t) for p in parts for t in p["top_logprobs"]] == [list(t) for t in whole["top_logprobs"]]


def test_llama_server_native_logprobs_keep_every_alternative(
    client: httpx.Client, gateway: GatewayThread, llama_server: Server
) -> None:
    body = {"prompt": PROMPT, "n_predict": TOKENS, "temperature": 0, "n_probs": 5}
    direct = _post(client, llama_server.url + "/completion", body)["completion_probabilities"]
    asked = {"model": f"ll/{MODEL}", "prompt": PROMPT, "max_tokens": TOKENS, "temperature": 0, "logprobs": 5}
    via = _gw(client, gateway, asked)
    lp = via["choices"][0]["logprobs"]
    assert [len(t) for t in lp["top_logprobs"]] == [len(p["top_logprobs"]) for p in direct]
    assert all(len(p["top_logprobs"]) == 5 for p in direct)
    _check_offsets(lp, PROMPT, via["choices"][0]["text"], [bytes(p["bytes"]) for p in direct])


def _check_offsets(lp: dict[str, Any], prompt: str, text: str, raws: list[bytes]) -> None:
    """Each whole-UTF-8 token's text sits at its offset in prompt + text; offsets never go back."""
    full = prompt + text
    offsets = lp["text_offset"]
    assert len(offsets) == len(raws) and offsets == sorted(offsets) and offsets[0] == len(prompt)
    whole = 0
    for offset, raw in zip(offsets, raws, strict=True):
        try:
            piece = raw.decode("utf-8")
        except UnicodeDecodeError:
            continue
        assert full[offset : offset + len(piece)] == piece, (offset, piece, full)
        whole += 1
    assert whole > len(raws) // 2  # most tokens checked


def test_llama_cpp_python_echo_offsets_are_the_servers(
    client: httpx.Client, gateway: GatewayThread, llama_cpp_python: Server
) -> None:
    body = {"prompt": RARE, "max_tokens": 4, "temperature": 0, "logprobs": 3, "echo": True}
    direct = _post(client, llama_cpp_python.url + "/v1/completions", {**body, "model": MODEL})["choices"][0]
    assert "" in direct["logprobs"]["tokens"]  # pieces of characters, which the server names ""
    via = _gw(client, gateway, {**body, "model": f"py/{MODEL}"})["choices"][0]
    assert via["text"] == direct["text"]
    assert via["logprobs"]["text_offset"] == direct["logprobs"]["text_offset"]
    assert via["logprobs"]["tokens"] == direct["logprobs"]["tokens"]
    plain = {**body, "echo": False}
    direct = _post(client, llama_cpp_python.url + "/v1/completions", {**plain, "model": MODEL})["choices"][0]
    via = _gw(client, gateway, {**plain, "model": f"py/{MODEL}"})["choices"][0]
    assert via["logprobs"]["text_offset"] == direct["logprobs"]["text_offset"]


# -- n, echo, context, usage ---------------------------------------------------------------------------------


def test_n_that_llama_cpp_python_ignores_fails_the_same_way_streamed_or_not(
    client: httpx.Client, gateway: GatewayThread, llama_cpp_python: Server
) -> None:
    gateway.pipeline.services.ignores_n.clear()
    body = {"prompt": PROMPT, "max_tokens": 4, "temperature": 0, "n": 2}
    direct = _post(client, llama_cpp_python.url + "/v1/completions", {**body, "model": MODEL})
    assert len(direct["choices"]) == 1  # the server's own answer ignores n
    events = _stream_raw(client, gateway.url + "/v1/completions", {**body, "model": f"py/{MODEL}", "stream": True})
    assert json.loads(events[-2])["error"]["code"] == "upstream_ignored_n"
    for stream in (True, False):
        err = _gw(client, gateway, {**body, "model": f"py/{MODEL}", "stream": stream}, 502)["error"]
        assert (err["code"], err["param"]) == ("upstream_ignored_n", "n")
    gateway.pipeline.services.ignores_n.clear()


def test_seeded_n_fanned_out_samples_each_choice_with_its_own_seed(
    client: httpx.Client, gateway: GatewayThread, llama_server: Server
) -> None:
    """llama-server answers one choice a call, so the gateway makes `n` calls; each takes the request's seed
    plus its choice's index (vLLM's rule for a seeded `n`): choice j is what llama-server samples with seed
    `seed + j`, and a seeded `n` is not `n` copies of one sample."""
    body = {"prompt": PROMPT, "max_tokens": TOKENS, "temperature": 1.5, "seed": 41}
    direct = [
        _post(client, llama_server.url + "/completion", {**body, "n_predict": TOKENS, "seed": 41 + j})["content"]
        for j in range(3)
    ]
    assert len(set(direct)) == 3, direct  # three seeds, three samples
    via = _gw(client, gateway, {**body, "model": f"ll/{MODEL}", "n": 3})
    assert [c["text"] for c in sorted(via["choices"], key=lambda c: c["index"])] == direct
    events = _stream(client, gateway.url + "/v1/completions", {**body, "model": f"ll/{MODEL}", "n": 3})
    streamed = ["".join(c["text"] for e in events for c in e["choices"] if c["index"] == j) for j in range(3)]
    assert streamed == direct
    # Chat fans out the same way.
    chat = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": TOKENS, "temperature": 1.5}
    alone = [
        _post(client, llama_server.url + "/v1/chat/completions", {**chat, "model": MODEL, "seed": 41 + j})
        for j in range(2)
    ]
    both = _post(client, gateway.url + "/v1/chat/completions", {**chat, "model": f"ll/{MODEL}", "seed": 41, "n": 2})
    assert [c["message"]["content"] for c in both["choices"]] == [a["choices"][0]["message"]["content"] for a in alone]


def test_guided_choice_is_decoded_by_llama_servers_grammar(client: httpx.Client, gateway: GatewayThread) -> None:
    """`guided_choice` goes to llama-server as a grammar of its choices, so even this random model answers one
    of them exactly, at a high temperature, plain and streamed, on both routes (checked and asked again, as
    the gateway did before, its answers would rarely pass). Quotes, backslashes, newlines and non-ASCII
    text in a choice are escaped, not read as grammar."""
    choices = ['say "hi"', "back\\slash", "two\nlines", "na\u00efve \u2713", "[x]-y"]
    seen: set[str] = set()
    for seed in range(4):
        body = {"model": f"ll/{MODEL}", "guided_choice": choices, "temperature": 1.5, "seed": seed, "max_tokens": 40}
        text = _gw(client, gateway, {**body, "prompt": PROMPT})["choices"][0]["text"]
        streamed = _text(_stream(client, gateway.url + "/v1/completions", {**body, "prompt": PROMPT}))
        chat = {**body, "messages": [{"role": "user", "content": PROMPT}]}
        said = _post(client, gateway.url + "/v1/chat/completions", chat)["choices"][0]["message"]["content"]
        assert {text, streamed, said} <= set(choices), (text, streamed, said)
        seen |= {text, said}
    assert len(seen) > 1  # sampled among the choices, not one forced answer


def _stream_raw(client: httpx.Client, url: str, body: dict[str, Any]) -> list[str]:
    with client.stream("POST", url, json=body) as resp:
        assert resp.status_code == 200
        return sse_data(resp.read().decode())


def test_echo_of_token_ids_on_llamacpp_is_refused_naming_echo(
    client: httpx.Client, gateway: GatewayThread, llama_server: Server
) -> None:
    ids = _post(client, llama_server.url + "/tokenize", {"content": PROMPT, "add_special": True})["tokens"]
    err = _gw(client, gateway, {"model": f"ll/{MODEL}", "prompt": ids, "max_tokens": 2, "echo": True}, 400)["error"]
    assert err["param"] == "echo"
    text = _gw(client, gateway, {"model": f"ll/{MODEL}", "prompt": PROMPT, "max_tokens": 2, "echo": True})
    assert text["choices"][0]["text"].startswith(PROMPT)


def test_a_prompt_over_the_context_has_one_code_and_falls_back(
    client: httpx.Client, gateway: GatewayThread, llama_server: Server
) -> None:
    long = "hello world " * 200  # about 400 tokens: over llama-server's 256, within llama-cpp-python's 1024
    direct = client.post(llama_server.url + "/v1/completions", json={"model": MODEL, "prompt": long, "max_tokens": 2})
    assert direct.status_code == 400 and direct.json()["error"]["type"] == "exceed_context_size_error"
    for provider in ("ll", "lv"):
        for stream in (False, True):
            body = {"model": f"{provider}/{MODEL}", "prompt": long, "max_tokens": 2, "stream": stream}
            err = _gw(client, gateway, body, 400)["error"]
            assert err["code"] == "context_length_exceeded", (provider, stream, err)
    served = client.post(gateway.url + "/v1/completions", json={"model": "small", "prompt": long, "max_tokens": 2})
    assert served.status_code == 200, served.text
    assert served.headers["x-gateway-provider"] == "py"


def test_llama_cpp_pythons_context_error_has_the_same_code(
    client: httpx.Client, gateway: GatewayThread, llama_cpp_python: Server
) -> None:
    longer = "hello world " * 600  # over llama-cpp-python's 1024 too
    body = {"model": MODEL, "prompt": longer, "max_tokens": 2}
    direct = client.post(llama_cpp_python.url + "/v1/completions", json=body)
    assert direct.status_code == 400, direct.text
    err = _gw(client, gateway, {**body, "model": f"py/{MODEL}"}, 400)["error"]
    assert err["code"] == "context_length_exceeded"
    # Streamed, the server fails inside its stream and sends a 200 with no event at all: nothing says why,
    # and the gateway answers what it answers for any stream that ends before its first event.
    empty = client.post(llama_cpp_python.url + "/v1/completions", json={**body, "stream": True})
    assert (empty.status_code, empty.content) == (200, b"")
    err = _gw(client, gateway, {**body, "model": f"py/{MODEL}", "stream": True}, 502)["error"]
    assert err["code"] == "upstream_stream_ended_early"


def test_a_llama_cpp_python_stream_books_estimated_usage(client: httpx.Client, gateway: GatewayThread) -> None:
    lines: list[dict[str, Any]] = []

    def listener(line: bytes) -> None:
        lines.append(json.loads(line))

    accesslog.SINK.listeners.append(listener)
    try:
        body = {"model": f"py/{MODEL}", "prompt": PROMPT, "max_tokens": TOKENS, "temperature": 0}
        events = _stream(client, gateway.url + "/v1/completions", body)
        assert all(e.get("usage") is None for e in events)
        wait_until(lambda: lines)
    finally:
        accesslog.SINK.listeners.remove(listener)
    line = lines[-1]
    assert line["usage_estimated"] is True
    assert line["completion_tokens"] >= TOKENS - 1 and line["prompt_tokens"] > 0


# -- lm-eval's local-completions through /m/<vendor>/<model>/v1/completions -------------------------------


def test_lm_eval_generate_until_through_the_model_path(
    client: httpx.Client, gateway: GatewayThread, llama_server: Server
) -> None:
    """`LocalCompletionsAPI._create_payload` for generate_until, and `parse_generations`."""
    contexts = [PROMPT, "Question: What is 2 + 2?\nAnswer:"]
    until = ["\n\n", "Question:"]
    body = {"prompt": contexts, "model": MODEL, "max_tokens": TOKENS, "temperature": 0, "stop": until, "seed": 1234}
    out = _post(client, f"{gateway.url}/m/ll/{MODEL}/v1/completions", {k: v for k, v in body.items() if k != "model"})
    generations = [c["text"] for c in sorted(out["choices"], key=lambda c: c["index"])]
    for context, generated in zip(contexts, generations, strict=True):
        native = {"prompt": context, "n_predict": TOKENS, "temperature": 0, "stop": until, "seed": 1234}
        assert generated == _post(client, llama_server.url + "/completion", native)["content"]


def test_lm_eval_loglikelihood_through_the_model_path(
    client: httpx.Client, gateway: GatewayThread, llama_cpp_python: Server
) -> None:
    """lm-eval's log-likelihood request with untokenized prompts (`tokenized_requests=False`, batch size 1,
    the only batch llama-cpp-python takes) and its `parse_logprobs`, against llama-cpp-python (llama-server
    does not echo prompts)."""
    context, continuation = "The quick brown fox jumps over the", " lazy dog"
    body = {"prompt": [context + continuation], "temperature": 0, "max_tokens": 1, "logprobs": 1, "seed": 1234}
    body["echo"] = True
    direct = _post(client, llama_cpp_python.url + "/v1/completions", {**body, "model": MODEL})
    via = _post(client, f"{gateway.url}/m/py/{MODEL}/v1/completions", body)
    assert via["choices"][0]["logprobs"] == direct["choices"][0]["logprobs"]
    assert via["choices"][0]["text"] == direct["choices"][0]["text"]
