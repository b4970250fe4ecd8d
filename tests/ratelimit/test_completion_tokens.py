"""A completion's token reservation counts what it sends beside its prompt, over real sockets, as a chat's does.

Tool definitions, a structured-output schema, the escape hatch's fields and a `suffix` go upstream with the
prompt and are billed as prompt: a token limit counts them as it counts the prompt (one token per 4 UTF-8
bytes of their JSON, or of the suffix's text, here, where no kind counts with OpenAI's tables), once per
prompt of a list, and each of `images` at `caps.image_tokens`. Limits are in process memory (the arithmetic
is the same over Redis) and each exact test has a key of its own, so `x-ratelimit-remaining-tokens` is the
limit minus this one reservation. The kinds are those that send each field (vLLM, SGP, Fireworks).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any, Final

import httpx
import pytest
from aiohttp import web

from tests.helpers.clients import client
from tests.helpers.servers import GatewayThread, serve_config
from tests.helpers.upstreams import Received, Upstream

IMAGE_TOKENS: Final = 2500
DAY: Final = 1_000_000  # the tpd of the exact tests' keys
CONFIG: Final = """
retries: {{attempts: 1}}
caps: {{image_tokens: 2500}}
keys:
  - {{name: small, key: k-small, limits: {{tpm: 1000}}}}
  - {{name: mid-prompt, key: k-mid-prompt, limits: {{tpm: 3000}}}}
  - {{name: mid-suffix, key: k-mid-suffix, limits: {{tpm: 3000}}}}
  - {{name: mid-schema, key: k-mid-schema, limits: {{tpm: 3000}}}}
  - {{name: schema, key: k-schema, limits: {{tpd: 1000000}}}}
  - {{name: batch, key: k-batch, limits: {{tpd: 1000000}}}}
  - {{name: image, key: k-image, limits: {{tpd: 1000000}}}}
  - {{name: plain, key: k-plain, limits: {{tpd: 1000000}}}}
  - {{name: forged, key: k-forged, limits: {{tpd: 1000000}}}}
  - {{name: forged-suffix, key: k-forged-suffix, limits: {{tpd: 1000000}}}}
providers:
  eng: {{kind: vllm, base_url: "{url}/v1", models: [m]}}
  sg: {{kind: sgp, api_key: sgp-key, base_url: "{url}/sgp", models: [m]}}
  fw: {{kind: fireworks, api_key: fw-key, base_url: "{url}/fw/inference/v1", models: [m]}}
"""
BIG: Final = "word " * 8000  # 40,000 bytes: 10,000 tokens by the estimate, ten times a 1000-tpm key's limit


async def billing(request: web.Request, received: Received) -> web.StreamResponse:
    """An OpenAI-compatible completion server that bills the whole body it was sent as prompt (4 bytes a
    token), as a provider bills tool definitions, schemas and a suffix with the prompt; a choice per prompt."""
    prompt = len(received.body) // 4
    sent = received.json()["prompt"]
    prompts = len(sent) if isinstance(sent, list) and not isinstance(sent[0], int) else 1
    choices = [{"index": i, "text": "ok", "finish_reason": "stop", "logprobs": None} for i in range(prompts)]
    usage = {"prompt_tokens": prompt, "completion_tokens": prompts, "total_tokens": prompt + prompts}
    return web.json_response(
        {"id": "c", "object": "text_completion", "created": 1, "model": "m", "choices": choices, "usage": usage}
    )


@pytest.fixture(scope="module")
def up() -> Iterator[Upstream]:
    with Upstream() as server:
        server.handler = billing
        yield server


@pytest.fixture(scope="module")
def gw(up: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayThread]:
    with serve_config(tmp_path_factory.mktemp("completion-tokens"), CONFIG.format(url=up.url)) as g:
        yield g


def post(gw: GatewayThread, key: str, payload: dict[str, Any]) -> httpx.Response:
    with client(gw.url, key) as c:
        return c.post("/v1/completions", json=payload)


def completion(model: str = "eng/m", **fields: Any) -> dict[str, Any]:
    return {"model": model, "prompt": "hi", "max_tokens": 1, **fields}


def tokens(text: str) -> int:
    """The estimate's count: one token per 4 UTF-8 bytes, rounded up."""
    return math.ceil(len(text.encode()) / 4)


def sent_json(value: object) -> str:
    """`value` as the gateway encodes it (compact, keys in the order given)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def tools(description: str) -> list[dict[str, Any]]:
    return [{"type": "function", "function": {"name": "f", "description": description, "parameters": {}}}]


SCHEMA: Final = {"type": "object", "description": BIG}


@pytest.mark.parametrize(
    ("model", "fields"),
    [
        ("eng/m", {"guided_json": SCHEMA}),
        ("eng/m", {"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA}}}),
        ("eng/m", {"guided_grammar": 'root ::= "' + "a" * 40_000 + '"'}),
        ("eng/m", {"inference_extra_params": {"documents": [BIG]}}),
        ("eng/m", {"suffix": BIG}),
        ("eng/m", {"suffix": BIG, "prompt": ["hi", "there"]}),
        ("sg/m", {"tools": tools(BIG)}),
        ("sg/m", {"prediction": {"type": "content", "content": BIG}}),
        ("fw/m", {"images": [f"https://example.com/{i}.png" for i in range(200)]}),
        ("fw/m", {"images": ["https://example.com/0.png"]}),  # 2,500 tokens: over 1,000 alone
    ],
    ids=[
        "guided_json",
        "response_format",
        "guided_grammar",
        "inference_extra_params",
        "suffix",
        "suffix-with-prompts",
        "tools",
        "prediction",
        "200-images",
        "one-image",
    ],
)
def test_what_a_completion_sends_beside_its_prompt_is_refused_as_a_prompt_of_its_size_is(
    gw: GatewayThread, up: Upstream, model: str, fields: dict[str, Any]
) -> None:
    up.reset()
    up.handler = billing
    as_prompt = post(gw, "k-small", completion(prompt=BIG))
    assert as_prompt.status_code == 400 and as_prompt.json()["error"]["code"] == "exceeds_token_limit"
    assert as_prompt.json()["error"]["param"] == "prompt"
    without = post(gw, "k-small", completion(model, prompt=fields.get("prompt", "hi")))
    assert without.status_code == 200, without.text
    refused = post(gw, "k-small", completion(model, **fields))
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["code"] == "exceeds_token_limit"
    # The field that weighs most is named, not max_tokens (1 here), which lowering could not make fit.
    assert refused.json()["error"]["param"] == next(iter(fields))
    assert len(up.received) == 1  # only the request without it reached the upstream


def test_a_suffix_or_a_schema_takes_a_small_key_as_the_same_bytes_as_a_prompt_do(
    gw: GatewayThread, up: Upstream
) -> None:
    """tpm 3000: a request of about 2,000 tokens passes once, and the next in the same minute is a 429, whether
    its bulk is the prompt, the suffix or a guided_json schema."""
    up.reset()
    up.handler = billing
    bulk = "word " * 1600  # 8,000 bytes
    for key, payload in [
        ("k-mid-prompt", completion(prompt=bulk)),
        ("k-mid-suffix", completion(suffix=bulk)),
        ("k-mid-schema", completion(guided_json={"type": "object", "description": bulk})),
    ]:
        assert post(gw, key, payload).status_code == 200
        again = post(gw, key, payload)
        assert again.status_code == 429, (key, again.text)
        assert again.json()["error"]["code"] == "rate_limit_exceeded"
    assert len(up.received) == 3


def test_a_completion_reserves_its_schema_and_suffix_once_per_prompt(gw: GatewayThread, up: Upstream) -> None:
    up.reset()
    up.handler = billing
    schema = {"type": "object", "description": "look it up " * 50}
    suffix = "the end " * 30
    one = post(gw, "k-schema", completion(guided_json=schema, suffix=suffix, max_tokens=10))
    assert one.status_code == 200, one.text
    reserved = tokens("hi") + tokens(sent_json(schema) + "\n" + suffix) + 10
    assert one.headers["x-ratelimit-remaining-tokens"] == str(DAY - reserved)

    batch = post(gw, "k-batch", completion(prompt=["hi", "there"], suffix=suffix, max_tokens=10))
    assert batch.status_code == 200, batch.text
    reserved = tokens("hi") + tokens("there") + 2 * tokens(suffix) + 2 * 10
    assert batch.headers["x-ratelimit-remaining-tokens"] == str(DAY - reserved)


def test_a_completion_reserves_its_images_allowance(gw: GatewayThread, up: Upstream) -> None:
    up.reset()
    up.handler = billing
    images = ["https://example.com/a.png", "https://example.com/b.png"]
    answer = post(gw, "k-image", completion("fw/m", images=images, max_tokens=10))
    assert answer.status_code == 200, answer.text
    reserved = tokens("hi") + 2 * IMAGE_TOKENS + 10
    assert answer.headers["x-ratelimit-remaining-tokens"] == str(DAY - reserved)


def test_a_completion_of_a_prompt_alone_reserves_its_prompt_and_a_clients_own_count_is_not_taken(
    gw: GatewayThread, up: Upstream
) -> None:
    """The counted part travels in the request under a name no client sends: a completion that sends it anyway
    (to lower its reservation) is counted as any other."""
    up.reset()
    up.handler = billing
    plain = post(gw, "k-plain", completion(max_tokens=10))
    assert plain.status_code == 200, plain.text
    assert plain.headers["x-ratelimit-remaining-tokens"] == str(DAY - tokens("hi") - 10)
    forged = {"text": "", "image_tokens": -500_000}
    cases: list[tuple[str, dict[str, Any], int]] = [
        ("k-forged", {}, tokens("hi") + 10),
        ("k-forged-suffix", {"suffix": "x" * 400}, tokens("hi") + tokens("x" * 400) + 10),
    ]
    for key, sent, reserved in cases:
        answer = post(gw, key, completion(**{" unrendered": forged, "max_tokens": 10, **sent}))
        assert answer.status_code == 200, answer.text
        assert answer.headers["x-ratelimit-remaining-tokens"] == str(DAY - reserved)


@pytest.mark.parametrize(
    ("fields", "param", "said"),
    [
        (
            {"max_tokens": 2000},
            "max_tokens",
            "2001 tokens (1 of prompt + 2000 max_tokens), more than the tpm limit of 1000 for key:small can ever "
            "allow; lower max_tokens to 999 or less",
        ),
        (
            {"suffix": "word " * 480, "max_tokens": 600},
            "max_tokens",
            "1201 tokens (1 of prompt + 600 sent beside it (most in 'suffix') + 600 max_tokens), more than the "
            "tpm limit of 1000 for key:small can ever allow; lower max_tokens to 399 or less",
        ),
        (
            {"suffix": "word " * 960, "max_tokens": 10},
            "suffix",
            "1211 tokens (1 of prompt + 1200 sent beside it (most in 'suffix') + 10 max_tokens), more than the "
            "tpm limit of 1000 for key:small can ever allow; send less in 'suffix'",
        ),
        (
            {"prompt": ["word " * 400] * 3, "max_tokens": 10},
            "prompt",
            "1530 tokens (1500 of prompt + 10 max_tokens x 3 choices), more than the tpm limit of 1000 for "
            "key:small can ever allow; shorten the prompt",
        ),
    ],
    ids=["max_tokens", "max_tokens-beside-a-suffix", "suffix", "prompts"],
)
def test_a_refusal_over_a_token_limit_counts_each_part_and_names_what_to_change(
    gw: GatewayThread, fields: dict[str, Any], param: str, said: str
) -> None:
    """The 400 gives the prompt's tokens, what is sent beside it and max_tokens, and names the field the client
    can act on: max_tokens only where lowering it alone fits. Before, every refusal said "lower max_tokens"
    with `param: max_tokens`, even where max_tokens was 10 and a suffix or the prompt was over the limit."""
    refused = post(gw, "k-small", completion(**fields))
    assert refused.status_code == 400, refused.text
    err = refused.json()["error"]
    assert (err["param"], err["code"]) == (param, "exceeds_token_limit")
    assert err["message"] == "This request needs up to " + said
