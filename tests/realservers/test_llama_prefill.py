"""Assistant prefill on the real llama-server (tests/realservers/conftest.py): a conversation ending with an
assistant message and `continue_final_message: true` is continued where that message ends, through the
`llamacpp` kind and the `vllm` kind alike, as llama-server continues it asked directly; and a chat stream
broken on another target is resumed on llama-server by continuing the message streamed so far.

Greedy decoding (temperature 0) of the same prompt answers the same tokens; each answer compared is taken
after the prompt is in the server's cache, as tests/realservers/test_llama_chat.py does.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.helpers.chat_scripts import Script, vllm_stream
from tests.helpers.servers import GatewayThread, serve_config
from tests.helpers.upstreams import Upstream

from .conftest import MODEL, Server

TOKENS = 12
PREFILL = "The fox says"
MESSAGES: list[dict[str, Any]] = [
    {"role": "system", "content": "You are a fox."},
    {"role": "user", "content": "What does the fox say?"},
]
CONTINUE = {"continue_final_message": True, "add_generation_prompt": False}  # what llama-server reads


def _post(client: httpx.Client, url: str, body: dict[str, Any]) -> dict[str, Any]:
    resp = client.post(url, json=body)
    assert resp.status_code == 200, resp.text
    out: dict[str, Any] = resp.json()
    return out


def _streamed(client: httpx.Client, url: str, body: dict[str, Any]) -> str:
    with client.stream("POST", url, json={**body, "stream": True}) as resp:
        assert resp.status_code == 200, resp.read()
        text = resp.read().decode()
    events = [line.removeprefix("data: ") for line in text.split("\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]", events[-3:]
    chunks = [json.loads(e) for e in events[:-1]]
    assert not any("error" in c for c in chunks), chunks
    return "".join(ch["delta"].get("content") or "" for c in chunks for ch in c["choices"])


def _direct(
    client: httpx.Client, server: Server, messages: list[dict[str, Any]], tokens: int, sent: str = PREFILL
) -> str:
    """llama-server's own continuation of `messages`' last message, from a cached prompt: its buffered answer
    is the whole message, which begins with the one sent."""
    body = {"model": MODEL, "messages": messages, "temperature": 0, **CONTINUE}
    _post(client, server.url + "/v1/chat/completions", {**body, "max_tokens": 1})
    answer = _post(client, server.url + "/v1/chat/completions", {**body, "max_tokens": tokens})
    content: str = answer["choices"][0]["message"]["content"]
    assert content.startswith(sent), (sent, content)
    return content[len(sent) :]


def test_a_prefilled_conversation_is_continued_as_llama_server_continues_it(
    client: httpx.Client, gateway: GatewayThread, llama_server: Server
) -> None:
    messages = [*MESSAGES, {"role": "assistant", "content": PREFILL}]
    direct = _direct(client, llama_server, messages, TOKENS)
    assert direct
    # The content is the continuation alone, buffered (where the gateway takes off the message llama-server
    # repeats) as streamed.
    body = {"model": f"ll/{MODEL}", "messages": messages, "max_tokens": TOKENS, "temperature": 0}
    body["continue_final_message"] = True
    url = gateway.url + "/v1/chat/completions"
    via = _post(client, url, body)
    assert via["choices"][0]["message"]["content"] == direct
    assert _streamed(client, url, body) == direct
    # With `echo`, the message comes back whole: the prefill, then what the server wrote after it.
    echoed = _post(client, url, {**body, "echo": True})
    assert echoed["choices"][0]["message"]["content"] == PREFILL + direct
    assert echoed["usage"]["completion_tokens"] == via["usage"]["completion_tokens"]

    # A message of text parts: llama-server renders (and repeats) them joined by blank lines.
    parts = [{"type": "text", "text": "The fox"}, {"type": "text", "text": " says"}]
    messages = [*MESSAGES, {"role": "assistant", "content": parts}]
    direct = _direct(client, llama_server, messages, TOKENS, sent="The fox\n\n says")
    assert _post(client, url, {**body, "messages": messages})["choices"][0]["message"]["content"] == direct


CONFIG = """
server: {{host: 127.0.0.1, port: 0}}
retries: {{attempts: 3, same_target: 0}}
providers:
  cut: {{kind: vllm, base_url: "{u}/cut/v1"}}
  ll: {{kind: llamacpp, base_url: "{ll}"}}
models:
  - name: resumable
    strategy: ordered
    targets: [{{model: cut/{model}}}, {{model: ll/{model}}}]
    resume_streams: true
"""


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    with Upstream() as server:
        yield server


@pytest.fixture(scope="module")
def resuming(
    upstream: Upstream, llama_server: Server, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayThread]:
    config = CONFIG.format(u=upstream.url, ll=llama_server.url, model=MODEL)
    with serve_config(tmp_path_factory.mktemp("resuming"), config) as gw:
        yield gw


def test_a_stream_broken_elsewhere_is_finished_by_llama_server(
    client: httpx.Client, upstream: Upstream, resuming: GatewayThread, llama_server: Server
) -> None:
    script = Script()
    upstream.handler = script
    script.behaviours["cut"] = vllm_stream(["The fox", " says"], usage=None, cut=True)
    # What llama-server writes after the two pieces, asked directly: the rest of the limit.
    rest = _direct(client, llama_server, [*MESSAGES, {"role": "assistant", "content": PREFILL}], TOKENS - 2)
    body = {"model": "resumable", "messages": MESSAGES, "max_tokens": TOKENS, "temperature": 0}
    assert _streamed(client, resuming.url + "/v1/chat/completions", body) == PREFILL + rest
    assert len(script.received["cut"]) == 1
