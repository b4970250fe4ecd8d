"""Property-based fuzzing of the four completion routes against a real gateway (issue 11).

The gateway is `python -m gateway serve` (uvicorn, a child process under an address-space limit, so a
request that makes it build an unbounded answer fails it instead of the machine), with the keyless
`fake` provider and a loopback OpenAI-compatible upstream that replays a recorded OpenAI completion
(as many choices as the request asks for). Hypothesis sends two kinds of bodies to every route:

- requests over the union schema (`wire/schema.py: CompletionRequest`): every field present or
  not, each with a plausible value or any JSON value at all (wrong types, huge numbers, deep nesting),
  plus unknown fields;
- raw hostile bytes: invalid UTF-8, JSON nested thousands of levels deep, numbers beyond any float,
  `NaN`/`Infinity` literals, duplicate keys, truncated JSON, non-object JSON, random bytes.

Properties, for every answer:
- no 5xx, except a 502/504 the fake provider was asked for by name (`demo/error-5xx`), or the 503 of
  that target cooling down afterwards: the loopback upstream always answers well, so any other 5xx
  is the gateway's own failure;
- an answer arrives within `ANSWER_S` (a frozen worker or a runaway answer is a failure too);
- a non-stream answer is JSON in its dialect's shape: a Completion, or OpenAI's
  `{"error": {message, type, param, code}}`, or FastAPI's `{"detail": str | [{loc, msg, type}]}`;
- a stream is `data: ...` events, each a JSON chunk or an error envelope, ending with `data: [DONE]`.

Bounded for CI: `MAX_EXAMPLES` per route, derandomized (the same examples on every run), no deadline.
Shrinking is off by default, because a hang costs `ANSWER_S` (plus a gateway restart) per shrink
step; set `FUZZ_SHRINK=1` to get a minimal failing body while investigating."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any, Final

import pytest
from hypothesis import HealthCheck, Phase, example, given, settings

from tests.helpers.upstreams import Upstream
from tests.security.fuzz_dialects_checks import check
from tests.security.fuzz_dialects_gateway import ROUTES, Gateway, recorded_answer
from tests.security.fuzz_dialects_strategies import bodies

MAX_EXAMPLES: Final = int(os.environ.get("FUZZ_EXAMPLES", "200"))


CONFIG: Final = """
server: {{host: 127.0.0.1, port: 0}}
logging: {{requests: false}}
retries: {{attempts: 1}}
timeouts: {{connect_ms: 2000, first_byte_ms: 8000, total_ms: 9000}}
providers:
  demo: {{kind: fake, models: [text, echo, long]}}
  up: {{kind: openai, api_key: sk-fuzz-upstream-2b7e, base_url: "{upstream}/v1"}}
  vl: {{kind: vllm, base_url: "{upstream}/v1", unsupported_params: drop}}
models:
  - {{name: fast, targets: [{{model: demo/text}}, {{model: up/davinci-002}}]}}
"""


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    upstream = Upstream()
    upstream.handler = recorded_answer
    upstream.start()
    path = tmp_path_factory.mktemp("fuzz") / "config.yaml"
    path.write_text(CONFIG.format(upstream=upstream.url))
    gw = Gateway(path)
    try:
        gw.start()
        yield gw
    finally:
        gw.stop()
        gw.client.close()
        upstream.stop()


FUZZ: Final = settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    phases=(
        [Phase.explicit, Phase.generate, Phase.shrink]
        if os.environ.get("FUZZ_SHRINK")
        else [Phase.explicit, Phase.generate]
    ),
    print_blob=True,
)

KNOWN: Final = (
    "known 500s being fixed on other branches of issue 11: invalid UTF-8 and deep nesting (item 11), "
    "non-latin-1 / control-character model names (items 2, 9), exceptions mid-stream without [DONE] "
    "(item 13), unbounded fake-provider and emulation work (item 14); the lead removes this mark after merging"
)


# One body per class of failure found on main while this test was written (issue 11), tried first on
# every run, so that CI meets each class whatever the generated examples happen to be.
KNOWN_BODIES: Final = [
    b'{"model": "demo/text", "prompt": "x\xff"}',  # invalid UTF-8
    b'{"model": "demo/text", "prompt": "hi", "inference_extra_params": ' + b'{"a":' * 5000 + b"1" + b"}" * 5001,
    b'{"model": "demo/y\\u4fda", "prompt": "x"}',  # a character beyond latin-1
    b'{"model": "demo/\\u0001", "prompt": "x"}',  # a control character
    b'{"model": "demo/\\u000e", "prompt": "x", "stream": true}',
    b'{"model": "demo/echo", "prompt": [""], "logprobs": 1, "stream": true}',
    b'{"model": "demo/text", "prompt": "", "logprobs": 1, "stream": true, "max_tokens": 0}',
    b'{"model": "demo/long", "prompt": "x", "max_tokens": 1000000}',  # unbounded fake-provider work: a frozen worker
]


def _known(test: Any) -> Any:
    for body in reversed(KNOWN_BODIES):
        test = example(body=body)(test)
    return test


@pytest.mark.timeout(600)
@pytest.mark.parametrize("route", list(ROUTES))
@FUZZ
@_known
@given(body=bodies)
def test_every_answer_is_json_in_the_dialects_shape_and_never_a_5xx(gateway: Gateway, route: str, body: bytes) -> None:
    check(gateway, route, body)
