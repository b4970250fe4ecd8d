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
step; set `FUZZ_SHRINK=1` to get a minimal failing body while investigating.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import httpx
import msgspec
import pytest
from aiohttp import web
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from tests.helpers.recordings import FIXTURES, sse_events
from tests.helpers.servers import GatewayProcess, cli_env
from tests.helpers.upstreams import Received, Upstream
from wire.schema import CompletionRequest

ROUTES: Final = {
    "/v1/completions": "openai",
    "/inference/v1/completions": "openai",
    "/v4/beta/completions": "fastapi",
    "/api/v1/compatibility/openai/v1/completions": "fastapi",
}
MAX_EXAMPLES: Final = int(os.environ.get("FUZZ_EXAMPLES", "200"))
ANSWER_S: Final = 10.0
# The gateway child may not map more than this: an unbounded answer fails it, not the machine.
ADDRESS_SPACE: Final = 6 * 1024**3

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

RECORDED: Final = json.loads((FIXTURES / "openai" / "completion_davinci002.json").read_bytes())
RECORDED_EVENTS: Final = [
    json.loads(e[len(b"data: ") :])
    for e in sse_events((FIXTURES / "openai" / "completion_stream_davinci002.sse.txt").read_bytes())
    if e != b"data: [DONE]"
]


# --------------------------------------------------------------------------------------------------
# The upstream: a recorded OpenAI answer, with as many choices as the request asks for


def _choices_asked(body: Any) -> int:
    if not isinstance(body, dict):
        return 1
    n, best = body.get("n"), body.get("best_of")
    n = n if isinstance(n, int) else 1
    best = best if isinstance(best, int) else 1
    prompt = body.get("prompt")
    prompts = len(prompt) if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int) else 1
    return max(1, min(max(n, best) * max(prompts, 1), 512))


async def _recorded(request: web.Request, received: Received) -> web.StreamResponse:
    try:
        body = json.loads(received.body)
    except ValueError:
        body = None
    count = _choices_asked(body)
    if not (isinstance(body, dict) and body.get("stream") is True):
        answer = dict(RECORDED, choices=[dict(RECORDED["choices"][0], index=i) for i in range(count)])
        return web.json_response(answer)
    resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await resp.prepare(request)
    for event in RECORDED_EVENTS:
        chunk = dict(event, choices=[dict(event["choices"][0], index=i) for i in range(count)])
        await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
    usage = dict(RECORDED_EVENTS[-1], choices=[], usage=RECORDED["usage"])
    await resp.write(b"data: " + json.dumps(usage).encode() + b"\n\ndata: [DONE]\n\n")
    await resp.write_eof()
    return resp


# --------------------------------------------------------------------------------------------------
# The gateway, restarted when an answer did not come (the next example gets a working one)


class Gateway:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.proc: GatewayProcess | None = None
        self.client = httpx.Client(trust_env=False, timeout=ANSWER_S)

    def start(self) -> None:
        env = cli_env()
        env.pop("PROMETHEUS_MULTIPROC_DIR", None)
        limit = ["prlimit", f"--as={ADDRESS_SPACE}", "--"] if shutil.which("prlimit") else []
        self.proc = GatewayProcess(self.path, env, prefix=limit)
        self.proc.wait_ready()

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()
            self.proc = None

    def restart(self) -> None:
        if self.proc is not None and self.proc.proc.poll() is None:
            self.proc.proc.kill()  # a frozen worker would sit out SIGTERM's grace
            self.proc.proc.wait(10)
        self.stop()
        self.client.close()
        self.client = httpx.Client(trust_env=False, timeout=ANSWER_S)
        self.start()

    def post(self, route: str, body: bytes) -> httpx.Response:
        assert self.proc is not None
        try:
            return self.client.post(self.proc.url + route, content=body, headers={"content-type": "application/json"})
        except httpx.HTTPError as exc:
            died = self.proc.proc.poll()
            self.restart()
            raise AssertionError(
                f"no complete answer ({type(exc).__name__}, timeout {ANSWER_S} s; gateway exit code {died})"
            ) from None


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    upstream = Upstream()
    upstream.handler = _recorded
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


# --------------------------------------------------------------------------------------------------
# Strategies

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=30)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)

MODELS: Final = [
    "demo/text",
    "demo/text",
    "demo/echo",
    "demo/long",
    "demo/drip-1ms",
    "demo/slow-5ms",
    "demo/error-429",
    "demo/error-400",
    "demo/error-503",
    "up/davinci-002",
    "vl/facebook/opt-125m",
    "vl/facebook/opt-125m",
    "fast",
    "nope/x",
    "demo",
    "",
]
models = (
    st.sampled_from(MODELS)
    | st.sampled_from(MODELS)
    | st.text(max_size=20)
    | st.builds(lambda v, rest: f"{v}/{rest}", st.sampled_from(["demo", "up", "vl"]), st.text(max_size=20))
)
# Valid token counts include large ones: nothing in the schema bounds them.
small_ints = st.integers(min_value=0, max_value=64) | st.sampled_from([100_000, 2**31 - 1])
texts = st.text(max_size=40)
prompts = (
    texts
    | st.lists(texts, max_size=3)
    | st.lists(st.integers(min_value=-1, max_value=50_000), max_size=5)
    | st.lists(st.lists(st.integers(min_value=0, max_value=50_000), max_size=4), max_size=3)
)
schemas = st.fixed_dictionaries(
    {"type": st.sampled_from(["object", "string", "integer", "array"])},
    optional={
        "properties": st.dictionaries(st.text(max_size=5), st.just({"type": "string"}), max_size=2),
        "pattern": st.text(max_size=12),
        "enum": st.lists(json_scalars, max_size=3),
    },
)
# A valid (or nearly valid) value for each field; wild requests give fields any JSON value at all
# (wrong types, out-of-range and huge numbers, nesting) instead.
PLAUSIBLE: Final[dict[str, st.SearchStrategy[Any]]] = {
    "model": models,
    "prompt": prompts,
    "max_tokens": small_ints,
    "max_new_tokens": small_ints,
    "max_completion_tokens": small_ints,
    "temperature": st.floats(min_value=0, max_value=2),
    "top_p": st.floats(min_value=0, max_value=1),
    "top_k": st.integers(min_value=-1, max_value=50),
    "frequency_penalty": st.floats(min_value=-2, max_value=2),
    "presence_penalty": st.floats(min_value=-2, max_value=2),
    "n": st.integers(min_value=1, max_value=4) | st.just(100_000),
    "best_of": st.integers(min_value=1, max_value=4) | st.just(100_000),
    "stop": texts | st.lists(texts, max_size=4),
    "stop_sequences": st.lists(texts, max_size=4),
    "include_stop_str_in_output": st.booleans(),
    "logprobs": st.booleans() | st.integers(min_value=0, max_value=5),
    "top_logprobs": st.integers(min_value=0, max_value=20),
    "return_token_log_probs": st.booleans(),
    "echo": st.booleans(),
    "suffix": texts,
    "seed": st.integers(),
    "logit_bias": st.dictionaries(st.text(max_size=6), st.floats(min_value=-100, max_value=100), max_size=3),
    "response_format": st.fixed_dictionaries(
        {"type": st.sampled_from(["text", "json_object", "json_schema"])},
        optional={"json_schema": st.fixed_dictionaries({"name": texts, "schema": schemas})},
    ),
    "guided_json": schemas,
    "guided_regex": st.text(alphabet="ab()+*?|[]{}^$.\\0123456789", max_size=20),
    "guided_choice": st.lists(texts, max_size=4),
    "guided_grammar": texts,
    "images": st.lists(texts, max_size=2),
    "context_length_exceeded_behavior": st.sampled_from(["truncate", "error"]),
    "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries({}, optional={"include_usage": st.booleans()}),
    "user": texts,
    "inference_timeout": st.floats(min_value=0.5, max_value=30) | texts,
    "inference_extra_params": st.dictionaries(st.text(max_size=8), json_values, max_size=3),
    "inference_extra_headers": st.dictionaries(st.text(max_size=12), st.text(max_size=12), max_size=3),
    "audio": st.dictionaries(st.text(max_size=6), json_values, max_size=2),
    "modalities": st.lists(st.sampled_from(["text", "audio"]), max_size=2),
    "tools": st.lists(st.dictionaries(st.text(max_size=6), json_values, max_size=2), max_size=2),
    "tool_choice": st.sampled_from(["none", "auto", "required"]) | st.just({"type": "function"}),
    "parallel_tool_calls": st.booleans(),
    "prediction": st.dictionaries(st.text(max_size=6), json_values, max_size=2),
    # Self-hosted servers' own sampling fields.
    "min_p": st.floats(min_value=0, max_value=1),
    "typical_p": st.floats(min_value=0, max_value=1),
    "repetition_penalty": st.floats(min_value=0.5, max_value=2),
    "repeat_last_n": st.integers(min_value=-1, max_value=64),
    "min_tokens": small_ints,
    "ignore_eos": st.booleans(),
    "stop_token_ids": st.lists(st.integers(min_value=0, max_value=50_000), max_size=3),
    "allowed_token_ids": st.lists(st.integers(min_value=0, max_value=50_000), max_size=3),
    "skip_special_tokens": st.booleans(),
    "spaces_between_special_tokens": st.booleans(),
    "add_special_tokens": st.booleans(),
    "truncate_prompt_tokens": st.integers(min_value=-1, max_value=4096),
    "prompt_logprobs": st.integers(min_value=0, max_value=5),
    "use_beam_search": st.booleans(),
    "length_penalty": st.floats(min_value=-2, max_value=2),
    "mirostat": st.sampled_from([0, 1, 2]),
    "mirostat_tau": st.floats(min_value=0, max_value=10),
    "mirostat_eta": st.floats(min_value=0, max_value=1),
    "num_ctx": st.integers(min_value=1, max_value=32_768),
    "watermark": st.booleans(),
    # Token-native answers (vLLM, SGLang).
    "return_token_ids": st.booleans(),
    "return_tokens_as_token_ids": st.booleans(),
    "priority": st.integers(min_value=-10, max_value=10),
    "cache_salt": st.sampled_from(["tenant-a", "", "a b", "run/17:x"]),
    "include_stop_reason": st.booleans(),
}
FIELDS: Final = [f.encode_name for f in msgspec.structs.fields(CompletionRequest)]
assert set(FIELDS) == set(PLAUSIBLE), "a new request field needs a plausible strategy here"

unknown_fields = st.dictionaries(
    st.text(min_size=1, max_size=10).filter(lambda k: k not in PLAUSIBLE), json_values, max_size=2
)


OPTIONAL: Final = [name for name in FIELDS if name not in ("model", "prompt")]


@st.composite
def requests(draw: st.DrawFn) -> bytes:
    """A JSON object over the union schema. Most carry a few fields with plausible values, so that
    answers (plain and streamed) are reached as often as refusals; some carry many, any of them with
    any JSON value at all, and unknown fields."""
    body: dict[str, Any] = {}
    wild = draw(st.integers(0, 3)) == 0
    for name in ("model", "prompt"):
        if draw(st.integers(0, 19)) > 0:
            body[name] = draw(PLAUSIBLE[name] | json_values) if wild else draw(PLAUSIBLE[name])
    chosen = draw(st.lists(st.sampled_from(OPTIONAL), unique=True, max_size=12 if wild else 4))
    for name in chosen:
        body[name] = draw(json_values) if wild and draw(st.booleans()) else draw(PLAUSIBLE[name])
    if not wild and draw(st.integers(0, 2)) == 0:
        body["stream"] = True
        if draw(st.booleans()):
            body["stream_options"] = {"include_usage": True}
    if wild and draw(st.booleans()):
        body.update(draw(unknown_fields))
    return json.dumps(body).encode()


_MODEL = st.sampled_from(["demo/text", "up/davinci-002", "vl/facebook/opt-125m", "fast"])


def _base(model: str) -> str:
    return f'{{"model": "{model}", "prompt": "hi", '


@st.composite
def invalid_utf8(draw: st.DrawFn) -> bytes:
    bad = draw(st.sampled_from([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80", b"\x80"]))
    where = draw(st.sampled_from(["prompt", "model", "user", "key"]))
    if where == "key":
        return b'{"model": "demo/text", "prompt": "hi", "' + bad + b'": 1}'
    body = {"model": draw(_MODEL), "prompt": "hi", where: "x"}
    return json.dumps(body).encode().replace(b'"x"', b'"x' + bad + b'"')


@st.composite
def deep_nesting(draw: st.DrawFn) -> bytes:
    depth = draw(st.sampled_from([5_000, 1_000, 200, 65, 50_000]))
    field = draw(st.sampled_from(["inference_extra_params", "response_format", "guided_json", "prompt", "stop"]))
    shape = draw(st.sampled_from(["dict", "list"]))
    inner = "[" * depth + "]" * depth if shape == "list" else '{"a":' * depth + "1" + "}" * depth
    if field == "prompt":
        return f'{{"model": "{draw(_MODEL)}", "prompt": {inner}}}'.encode()
    if field in ("response_format", "inference_extra_params", "guided_json") and shape == "list":
        inner = '{"a": ' + inner + "}"
    return (_base(draw(_MODEL)) + f'"{field}": {inner}}}').encode()


@st.composite
def huge_numbers(draw: st.DrawFn) -> bytes:
    field = draw(st.sampled_from(["max_tokens", "temperature", "n", "seed", "top_k", "logprobs", "best_of"]))
    number = draw(st.sampled_from(["1e400", "-1e400", "99999999999999999999999999", "-9" * 40, "1e-400", "0e0"]))
    return (_base(draw(_MODEL)) + f'"{field}": {number}}}').encode()


@st.composite
def non_finite(draw: st.DrawFn) -> bytes:
    field = draw(st.sampled_from(["temperature", "top_p", "max_tokens", "inference_timeout", "logit_bias"]))
    literal = draw(st.sampled_from(["NaN", "Infinity", "-Infinity", "nan", "inf"]))
    value = f'{{"1": {literal}}}' if field == "logit_bias" else literal
    return (_base(draw(_MODEL)) + f'"{field}": {value}}}').encode()


@st.composite
def duplicate_keys(draw: st.DrawFn) -> bytes:
    field = draw(st.sampled_from(["model", "prompt", "stream", "max_tokens"]))
    value = draw(st.sampled_from(['"nope/x"', "true", "3", '"y"', "null", "[]"]))
    return (_base(draw(_MODEL)) + f'"{field}": {value}, "{field}": {value}}}').encode()


@st.composite
def truncated(draw: st.DrawFn) -> bytes:
    whole = draw(requests())
    return whole[: draw(st.integers(0, max(len(whole) - 1, 0)))]


@st.composite
def huge_strings(draw: st.DrawFn) -> bytes:
    size = draw(st.sampled_from([100_000, 1_000_000]))
    field = draw(st.sampled_from(["prompt", "model", "stop", "user", "suffix"]))
    return json.dumps({"model": draw(_MODEL), "prompt": "hi", field: "a" * size}).encode()


@st.composite
def odd_model_names(draw: st.DrawFn) -> bytes:
    """Control characters and text beyond latin-1, where a model name may reach headers or URLs."""
    name = draw(st.text(alphabet=st.characters(codec="utf-8"), min_size=1, max_size=12))
    vendor = draw(st.sampled_from(["demo/", "up/", "vl/", ""]))
    return json.dumps({"model": vendor + name, "prompt": "x", "stream": draw(st.booleans())}).encode()


hostile = st.one_of(
    invalid_utf8(),
    deep_nesting(),
    huge_numbers(),
    non_finite(),
    duplicate_keys(),
    truncated(),
    st.builds(lambda v: json.dumps(v).encode(), json_values),  # JSON that is not an object
    huge_strings(),
    odd_model_names(),
    st.binary(max_size=200),
)
bodies = requests() | hostile


# --------------------------------------------------------------------------------------------------
# Properties


def _strict_json(text: str) -> Any:
    def refuse(literal: str) -> Any:
        raise ValueError(f"not JSON: {literal}")

    return json.loads(text, parse_constant=refuse)


def _error_shape(dialect: str, status: int, doc: Any) -> None:
    if dialect == "openai":
        assert isinstance(doc, dict) and set(doc) == {"error"}, f"not an OpenAI error envelope: {doc!r}"
        err = doc["error"]
        assert isinstance(err, dict) and set(err) == {"message", "type", "param", "code"}, err
        assert isinstance(err["message"], str) and isinstance(err["type"], str), err
        return
    assert isinstance(doc, dict) and set(doc) == {"detail"}, f"not a FastAPI error: {doc!r}"
    detail = doc["detail"]
    if isinstance(detail, list):
        assert status == 422, (status, detail)
        for item in detail:
            assert set(item) == {"loc", "msg", "type"} and item["loc"][0] == "body", item
    else:
        assert isinstance(detail, str), detail


def _completion_shape(doc: Any) -> None:
    assert isinstance(doc, dict) and doc.get("object") == "text_completion", doc
    assert isinstance(doc["id"], str) and isinstance(doc["model"], str) and isinstance(doc["choices"], list), doc
    for choice in doc["choices"]:
        assert isinstance(choice["text"], str) and isinstance(choice["index"], int), choice


_ASKED_FAILURE: Final = re.compile(r"^demo/error-5\d\d$")


def _model_of(body: bytes) -> str | None:
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    return doc.get("model") if isinstance(doc, dict) and isinstance(doc.get("model"), str) else None


def check(gateway: Gateway, route: str, body: bytes) -> None:
    dialect = ROUTES[route]
    resp = gateway.post(route, body)
    status = resp.status_code
    if status >= 500:
        # A failure the fake provider was asked for, or the cooldown it then earned its target.
        asked = status in (502, 503, 504) and _ASKED_FAILURE.match(_model_of(body) or "")
        assert asked, f"{status} from the gateway itself: {resp.text[:300]!r}"
    kind = resp.headers.get("content-type", "")
    if kind.startswith("text/event-stream"):
        assert status == 200, status
        events = [e for e in resp.text.split("\n\n") if e]
        assert events and events[-1] == "data: [DONE]", f"a stream that does not end with [DONE]: {events[-2:]!r}"
        for event in events[:-1]:
            assert event.startswith("data: "), event
            doc = _strict_json(event[len("data: ") :])
            if "error" in doc:
                _error_shape("openai", 200, doc)  # mid-stream errors are OpenAI's envelope in every dialect
            else:
                _completion_shape(doc)
        return
    assert kind.startswith("application/json"), f"{status} answered as {kind!r}: {resp.text[:200]!r}"
    doc = _strict_json(resp.text)
    if status == 200:
        _completion_shape(doc)
    else:
        assert 400 <= status < 600, status
        _error_shape(dialect, status, doc)


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
