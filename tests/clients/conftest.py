"""The gateway as the clients people already run see it, over real sockets.

One gateway (uvicorn in a thread, `tests/helpers/servers.py`) serves the keyless `demo` fake, `local`, a vLLM
server played by a loopback aiohttp upstream (`VLLMLike`), and `oa` (kind openai) and `vc` (kind vllm) in front
of a loopback OpenAI chat route (`chatlike.ChatLike`, whose module says where its shape comes from).
`VLLMLike` answers the way vLLM's OpenAI server does; where its shape comes from:

- the envelope and a choice's keys: the recorded vLLM answer `tests/fixtures/vllm/completion_opt125m.json`
  (`stop_reason` beside `finish_reason`, `usage` with `total_tokens` before `completion_tokens`), which is
  used as the template of every answer;
- logprobs: vLLM's `vllm/entrypoints/openai/completion/serving.py` (vllm-project/vllm @ 030ea52e,
  `request_output_to_completion_response`, `completion_stream_generator`, `_create_completion_logprobs`)
  and a real vLLM v0.16.0 answer to `echo: true, logprobs: 5, max_tokens: 1` quoted in
  ggml-org/llama.cpp#15189: with echo the prompt's tokens come first, the first with `token_logprobs`
  and `top_logprobs` both `null`; `top_logprobs` holds the token and the top k (k + 1 entries when the
  token is not among them); `text_offset` counts from the start of the choice's own text (0 without echo,
  unlike OpenAI); streamed offsets continue per choice; choices are numbered prompt_index * n + j;
- streams: one chunk per token with `"usage": null`, the echoed prompt riding on a choice's first chunk,
  then a usage chunk with empty `choices` when `stream_options.include_usage` is set.

Token ids and words are this file's own toy tokenizer: a prompt of token ids decodes id i to
`VOCAB[i % len(VOCAB)]` with a leading space; a text prompt splits into words with their leading white
space. Logprobs are deterministic hashes, so a test can compute what the upstream sent.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
import time
from bisect import bisect_left
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any

import httpx
import pytest
from aiohttp import web

from tests.helpers.recordings import fixture_json
from tests.helpers.servers import GatewayThread, serve_config
from tests.helpers.upstreams import Received, Upstream

from .chatlike import ChatLike

CLIENTS_KEY = "gk-clients-5e0c9a"
VLLM_MODEL = "facebook/opt-125m"  # the model of the vLLM recording the answers are built on
LOCAL = f"local/{VLLM_MODEL}"  # what a client asks the gateway for

VOCAB = ("the", "cat", "sat", "on", "mat", "Question", ":", "Answer", "yes", "no", "2", "+", "=", "4", "\n")
# Generated words: "\n" then "def" completes the humaneval stop sequence "\ndef".
GEN_WORDS = (" return", " x", " +", " 1", "\n", "def", " f", "(", "):", " y", "\n", "#", " done")
_TOKEN = re.compile(r"\s*\S+|\s+")

CONFIG = """
server: {{host: 127.0.0.1, port: 0}}
unsupported_params: error
timeouts: {{connect_ms: 2000, first_byte_ms: 10000, total_ms: 20000}}
retries: {{attempts: 1}}
keys:
  - {{name: clients, key: "${{CLIENTS_KEY}}"}}
providers:
  demo: {{kind: fake}}
  local: {{kind: vllm, base_url: {u}/v1}}
  oa: {{kind: openai, base_url: {c}/v1, api_key: sk-chat-upstream}}
  vc: {{kind: vllm, base_url: {c}/v1}}
"""


def _hash(*parts: object) -> int:
    digest = hashlib.blake2b("\x00".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def tokenize(text: str) -> list[str]:
    return _TOKEN.findall(text)


def decode(ids: list[int]) -> list[str]:
    return [" " + VOCAB[i % len(VOCAB)] for i in ids]


@dataclass
class Piece:
    """What one stream chunk of one choice carries."""

    text: str
    tokens: list[str]
    logprobs: list[float | None]
    tops: list[dict[str, float] | None]


@dataclass
class Choice:
    index: int
    pieces: list[Piece] = field(default_factory=list)
    finish_reason: str = "length"
    stop_reason: str | None = None
    generated: int = 0  # tokens generated, the echoed prompt's not counted

    @property
    def text(self) -> str:
        return "".join(p.text for p in self.pieces)


def _top(token: str, logprob: float, k: int, likeliest: bool) -> dict[str, float]:
    """vLLM's entry: the token first, then the top k (a greedy token is one of them)."""
    top = {token: logprob}
    for j in range(k if not likeliest else k - 1):
        alt = round((logprob if likeliest else -0.5) - 0.75 * (j + 1), 4)
        top[f" <alt{j}>"] = alt
    return top


class VLLMLike:
    """The answers of a vLLM server to /v1/completions, computed from the request (see the module doc)."""

    def __init__(self) -> None:
        self.template = fixture_json("vllm/completion_opt125m.json")

    def prompts(self, prompt: Any) -> list[list[str]]:
        """Each prompt as the tokens vLLM would echo."""
        if isinstance(prompt, str):
            return [tokenize(prompt)]
        if prompt and isinstance(prompt[0], int):
            return [decode(prompt)]
        return [tokenize(p) if isinstance(p, str) else decode(p) for p in prompt]

    def choices(self, body: dict[str, Any]) -> list[Choice]:
        n = body.get("n") or 1
        max_tokens = 16 if body.get("max_tokens") is None else body["max_tokens"]
        echo = bool(body.get("echo"))
        k = body.get("logprobs")
        stop = body.get("stop") or []
        stops = [stop] if isinstance(stop, str) else list(stop)
        out: list[Choice] = []
        for p_index, p_tokens in enumerate(self.prompts(body["prompt"])):
            prompt_text = "".join(p_tokens)
            for j in range(n):
                choice = Choice(index=p_index * n + j)
                seed = _hash(prompt_text, j, body.get("seed"))
                natural = 6 + seed % 6
                toks = [GEN_WORDS[(seed + i) % len(GEN_WORDS)] for i in range(min(natural, max_tokens))]
                full = "".join(toks)
                cut = len(full)
                choice.finish_reason = "stop" if natural < max_tokens else "length"
                hits = [(full.find(s), s) for s in stops if s and s in full]
                if hits:
                    # Generation ends with the token that completes the first stop; the text ends before it.
                    cut, hit = min(hits)
                    ends = list(accumulate(map(len, toks)))
                    toks = toks[: bisect_left(ends, cut + len(hit)) + 1]
                    choice.finish_reason, choice.stop_reason = "stop", hit
                choice.generated = len(toks)
                generated: list[Piece] = []
                pos = 0
                for i, tok in enumerate(toks):
                    lp = -round((_hash(seed, i) % 40) / 100 + 0.01, 4)
                    piece = full[pos : min(pos + len(tok), cut)] if pos < cut else ""
                    generated.append(Piece(piece, [tok], [lp], [_top(tok, lp, k or 0, True)]))
                    pos += len(tok)
                if echo:
                    lps: list[float | None] = [None]
                    tops: list[dict[str, float] | None] = [None]
                    for i, tok in enumerate(p_tokens[1:], start=1):
                        lp = -round((_hash(prompt_text, "prompt", i) % 900) / 100 + 0.01, 4)
                        lps.append(lp)
                        tops.append(_top(tok, lp, k or 0, False))
                    echoed = Piece(prompt_text, list(p_tokens), lps, tops)
                    if generated:
                        first = generated[0]
                        generated[0] = Piece(
                            echoed.text + first.text,
                            echoed.tokens + first.tokens,
                            echoed.logprobs + first.logprobs,
                            echoed.tops + first.tops,
                        )
                    else:
                        generated = [echoed]
                choice.pieces = generated
                out.append(choice)
        return out

    @staticmethod
    def logprobs(pieces: list[Piece], start: int) -> dict[str, Any]:
        """vLLM's `_create_completion_logprobs`: offsets from `initial_text_offset`, by each token's length."""
        tokens = [t for p in pieces for t in p.tokens]
        offsets: list[int] = []
        pos = start
        for tok in tokens:
            offsets.append(pos)
            pos += len(tok)
        return {
            "text_offset": offsets,
            "token_logprobs": [lp for p in pieces for lp in p.logprobs],
            "tokens": tokens,
            "top_logprobs": [t for p in pieces for t in p.tops],
        }

    def usage(self, body: dict[str, Any], choices: list[Choice]) -> dict[str, int]:
        prompt = sum(len(p) for p in self.prompts(body["prompt"]))
        completion = sum(c.generated for c in choices)
        return {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion}

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        choices = self.choices(body)
        out: dict[str, Any] = copy.deepcopy(self.template)
        out["id"] = f"cmpl-{_hash(json.dumps(body, sort_keys=True)):016x}"
        out["created"] = int(time.time())
        out["model"] = body["model"]
        template = out["choices"][0]
        with_logprobs = body.get("logprobs") is not None
        out["choices"] = [
            {
                **template,
                "index": c.index,
                "text": c.text,
                "logprobs": self.logprobs(c.pieces, 0) if with_logprobs else None,
                "finish_reason": c.finish_reason,
                "stop_reason": c.stop_reason,
            }
            for c in choices
        ]
        out["usage"] = self.usage(body, choices)
        return out

    def chunks(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        """The stream: the choices' chunks interleaved (vLLM merges its per-prompt generators)."""
        choices = self.choices(body)
        with_logprobs = body.get("logprobs") is not None
        head: dict[str, Any] = {"id": f"cmpl-{_hash(json.dumps(body, sort_keys=True)):016x}"}
        head |= {"object": "text_completion"}
        head |= {"created": int(time.time()), "model": body["model"]}
        sent = {c.index: 0 for c in choices}
        out: list[dict[str, Any]] = []
        for step in range(max(len(c.pieces) for c in choices)):
            for c in choices:
                if step >= len(c.pieces):
                    continue
                piece = c.pieces[step]
                last = step == len(c.pieces) - 1
                choice = {
                    "index": c.index,
                    "text": piece.text,
                    "logprobs": self.logprobs([piece], sent[c.index]) if with_logprobs else None,
                    "finish_reason": c.finish_reason if last else None,
                    "stop_reason": c.stop_reason if last else None,
                }
                sent[c.index] += len(piece.text)
                out.append({**head, "choices": [choice], "usage": None})
        if (body.get("stream_options") or {}).get("include_usage"):
            out.append({**head, "choices": [], "usage": self.usage(body, choices)})
        return out

    async def handler(self, request: web.Request, received: Received) -> web.StreamResponse:
        if received.path != "/v1/completions":
            return web.json_response({"object": "error", "message": "Not Found", "code": 404}, status=404)
        body = received.json()
        if not body.get("stream"):
            return web.json_response(self.answer(body))
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        for chunk in self.chunks(body):
            await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


@pytest.fixture(scope="session")
def vllm_like() -> VLLMLike:
    return VLLMLike()


@pytest.fixture(scope="session")
def vllm_upstream(vllm_like: VLLMLike) -> Iterator[Upstream]:
    with Upstream() as server:
        server.handler = vllm_like.handler
        yield server


@pytest.fixture
def upstream(vllm_upstream: Upstream, vllm_like: VLLMLike) -> Iterator[Upstream]:
    """The vLLM upstream with what it received emptied (its handler stays the vLLM one)."""
    vllm_upstream.received = []
    yield vllm_upstream
    vllm_upstream.received = []
    vllm_upstream.handler = vllm_like.handler


@pytest.fixture(scope="session")
def chat_like() -> ChatLike:
    return ChatLike()


@pytest.fixture(scope="session")
def chat_server(chat_like: ChatLike) -> Iterator[Upstream]:
    """OpenAI's chat route (`chatlike.py`), behind the providers `oa` (kind openai) and `vc` (kind vllm)."""
    with Upstream() as server:
        server.handler = chat_like.handler
        yield server


@pytest.fixture
def chat_upstream(chat_server: Upstream) -> Iterator[Upstream]:
    """The chat upstream with what it received emptied."""
    chat_server.received = []
    yield chat_server
    chat_server.received = []


@pytest.fixture(scope="session")
def gateway(
    vllm_upstream: Upstream, chat_server: Upstream, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayThread]:
    config = CONFIG.format(u=vllm_upstream.url, c=chat_server.url)
    with serve_config(tmp_path_factory.mktemp("clients"), config, {"CLIENTS_KEY": CLIENTS_KEY}) as gw:
        yield gw


@pytest.fixture(scope="session")
def api(gateway: GatewayThread) -> Iterator[httpx.Client]:
    """A raw HTTP client with the clients' key, as lm-eval's `requests.post` sends it."""
    with httpx.Client(
        base_url=gateway.url, trust_env=False, timeout=15, headers={"authorization": f"Bearer {CLIENTS_KEY}"}
    ) as client:
        yield client
