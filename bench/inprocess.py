"""The gateway's real ASGI app and pipeline driven in process, one request after another (or C at once),
for bench.instructions, bench.roundtrips and bench.wings: the config, the request bodies, the ASGI calls
and the loopback upstream they share.

It only touches ``gateway.config.parse_config``, ``gateway.edge.app.create_app`` and the ASGI protocol, so
it runs unchanged on older trees (copy it there with bench/instructions.py to compare).
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

PATHS = ("fake", "h1", "fake-stream", "h1-stream", "chat", "chat-stream", "fake-chat", "fake-chat-stream")
MODELS = {"fake": "demo/text", "h1": "up/bench-model"}
NOT_SERVED = 3  # the inner run's exit status when the tree has no route for the path (chat on older trees)
# The bench's request (bench/scenarios.py REQUEST), repeated here so older trees need nothing new.
REQUEST: dict[str, object] = {"prompt": "Say hello", "max_tokens": 16}
# `--stops`: stop lists the gateway enforces itself (over OpenAI's 4). lm-eval's HumanEval `until` plus its EOS;
# `many` adds prompt-format stops, some starting with characters the upstream's " tok<i>" text holds.
STOPS: dict[str, list[str]] = {
    "none": [],
    "lm-eval": ["\nclass", "\ndef", "\n#", "\nif", "\nprint", "<|endoftext|>"],
    "many": [
        *["\nclass", "\ndef", "\n#", "\nif", "\nprint", "<|endoftext|>", "Question:", "</s>", "<|im_end|>"],
        *["\n\n", "Q:", "A:", "Problem:", "Solution:", "###", "Human:", "Assistant:", "User:", "[INST]"],
        *["tokens:", "ok.", "1.", "0)", " t0k"],
    ],
}


def config_text(upstream_port: int | None, cache: str = "off") -> str:
    """The gateway config: the bench's (no keys, defaults everywhere) plus the keyless fake provider."""
    lines = ["server: {host: 127.0.0.1, port: 8080}", "providers:", "  demo: {kind: fake}"]
    if upstream_port is not None:
        lines.append(f"  up: {{kind: openai, base_url: 'http://127.0.0.1:{upstream_port}/v1', api_key: bench-key}}")
    if cache != "off":
        lines.append(f"cache: {{mode: {cache}}}")  # only trees with the response cache accept it
    cap = os.environ.get("BENCH_MAX_CONCURRENCY")  # `--max-concurrency`: every provider's server has a queue
    if cap:
        lines = [line[:-1] + f", max_concurrency: {int(cap)}}}" if line.startswith("  ") else line for line in lines]
    redis = os.environ.get("BENCH_REDIS_URL")  # `--redis`
    if redis:
        lines.append(f"redis: {{url: '{redis}'}}")
    if os.environ.get("BENCH_LIMITS"):  # `--limits`: checked and charged on every request, never refused
        # `--team-limits`: the key's team has the same limits, charged with the key's (only trees with team limits).
        team = ", team: bench" if os.environ.get("BENCH_TEAM_LIMITS") else ""
        lines += ["keys:", f"  - {{name: bench, key: bench-key{team}, limits: {{rpm: 100000000, tpm: 10000000000}}}}"]
        if team:
            lines += ["teams:", "  bench: {limits: {rpm: 100000000, tpm: 10000000000}}"]
    if os.environ.get("BENCH_NO_ACCESS_LOG"):  # `--no-access-log`: the access log is on unless told otherwise
        lines.append("logging: {requests: false}")
    ledger = os.environ.get("BENCH_LEDGER_URL")  # `--ledger`: every request booked (valgrind's child inherits it)
    if ledger:
        # As a saturated gateway runs it: the writer commits full batches (batch_rows, 500), not whatever one
        # second of a valgrind-slowed run holds; time-driven work (the keys' poll) is per second, not per request.
        lines.append(f"ledger: {{url: '{ledger}', flush_ms: 60000, keys_poll_ms: 2000}}")
    return "\n".join(lines) + "\n"


class NotServed(Exception):
    """The tree answers the path's route with 404 or 405: it predates it."""


def is_chat(path: str) -> bool:
    return "chat" in path.split("-")


def needs_upstream(path: str) -> bool:
    return not path.startswith("fake")


def request_body(path: str, i: int | None = None, stops: str = "none") -> bytes:
    model = MODELS["fake" if path.startswith("fake") else "h1"]
    req: dict[str, object] = {"model": model, **REQUEST, **({"stream": True} if path.endswith("-stream") else {})}
    if STOPS[stops]:
        req["stop"] = STOPS[stops]
    if i is not None:
        req["prompt"] = f"{REQUEST['prompt']} {i:07d}"  # one length for all: only the cache can tell them apart
    if is_chat(path):
        req["messages"] = [{"role": "user", "content": req.pop("prompt")}]
    return msgspec.json.encode(req)


def scope_of(body: bytes, route: str = "/v1/completions") -> dict[str, Any]:
    # What the gateway's HTTP/1.1 protocol (gateway/server) hands an app for the bench's wrk request; the
    # disconnect extension is given a fresh callback slot per request, as a connection's request cycle does.
    headers = [
        (b"host", b"127.0.0.1:8080"),
        (b"content-length", str(len(body)).encode()),
        (b"content-type", b"application/json"),
        (b"authorization", b"Bearer bench-key"),
    ]
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "server": ("127.0.0.1", 8080),
        "client": ("127.0.0.1", 40000),
        "scheme": "http",
        "method": "POST",
        "root_path": "",
        "path": route,
        "raw_path": route.encode(),
        "query_string": b"",
        "headers": headers,
        "state": {},
        "extensions": {"gateway.disconnect": _Gone().subscribe},
    }


class _Gone:
    """A request's disconnect callback, held as `gateway.server`'s request cycle holds it (never called: the
    bench's client stays)."""

    __slots__ = ("gone",)

    def __init__(self) -> None:
        self.gone: Callable[[], None] | None = None

    def subscribe(self, gone: Callable[[], None]) -> None:
        self.gone = gone


async def send_one(
    app: Any, body: bytes, route: str = "/v1/completions", answered: Callable[[], None] | None = None
) -> tuple[int, bytes]:
    """One request through the ASGI app: its status and body; `answered` is called at the body's last byte."""
    answer: dict[str, Any] = {"status": 0, "body": bytearray()}
    sent = False
    never: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await never  # the client stays connected; the endpoint cancels its watcher when done
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            answer["status"] = message["status"]
        else:
            answer["body"] += message.get("body", b"")
            if answered is not None and not message.get("more_body", False):
                answered()

    await app(scope_of(body, route), receive, send)
    return answer["status"], bytes(answer["body"])


async def lifespan(app: Any) -> Callable[[], Any]:
    """Start the app's lifespan as a server would; returns the coroutine function that shuts it down."""
    inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    outbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    task = asyncio.ensure_future(
        app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}, inbox.get, outbox.put)
    )
    await inbox.put({"type": "lifespan.startup"})
    started = await outbox.get()
    if started["type"] != "lifespan.startup.complete":
        raise RuntimeError(f"lifespan startup failed: {started}")

    async def shutdown() -> None:
        await inbox.put({"type": "lifespan.shutdown"})
        await outbox.get()
        await task

    return shutdown


async def drive(
    path: str,
    requests: int,
    warmup: int,
    upstream_port: int | None,
    around: Callable[[bool], None] | None = None,
    cache: str = "off",
    vary: bool = False,
    stops: str = "none",
) -> None:
    """Push `warmup` then `requests` completions through the app; `around(True/False)` brackets the latter."""
    from gateway.config import parse_config
    from gateway.edge.app import create_app
    from gateway.ops import accesslog

    # The access line is built and buffered as in production; only the write goes nowhere.
    devnull, kept = os.open(os.devnull, os.O_WRONLY), accesslog.SINK.fd
    accesslog.SINK.fd = devnull
    app = create_app(parse_config(config_text(upstream_port, cache), "bench-instructions.yaml"))
    shutdown = await lifespan(app)
    body = request_body(path, 0 if vary else None, stops)
    chat = is_chat(path)
    route = "/v1/chat/completions" if chat else "/v1/completions"
    marker = b"[DONE]" if path.endswith("-stream") else b'"chat.completion"' if chat else b'"text_completion"'
    concurrency = int(os.environ.get("BENCH_CONCURRENCY") or 1)  # `--concurrency`

    async def client(first: int, end: int) -> None:
        # Requests first, first + concurrency, ... before `end`: one of `concurrency` clients.
        for i in range(first, end, concurrency):
            status, answer = await send_one(app, request_body(path, i, stops) if vary else body, route)
            if status != 200 or marker not in answer:
                raise RuntimeError(f"request {i} on {path}: {status} {answer[:300]!r}")

    try:
        if concurrency > 1:
            await asyncio.gather(*(client(k, warmup) for k in range(concurrency)))
            if around is not None:
                around(True)
            await asyncio.gather(*(client(warmup + k, warmup + requests) for k in range(concurrency)))
            if around is not None:
                around(False)
            return
        for i in range(warmup + requests):
            if i == warmup and around is not None:
                around(True)
            if vary:
                body = request_body(path, i, stops)
            status, answer = await send_one(app, body, route)
            if i == 0 and chat and status in (404, 405):
                raise NotServed(path)
            if status != 200 or marker not in answer:
                raise RuntimeError(f"request {i} on {path}: {status} {answer[:300]!r}")
        if around is not None:
            around(False)
    finally:
        await shutdown()
        accesslog.SINK.flush()
        accesslog.SINK.fd = kept
        os.close(devnull)


def loop_runner() -> Callable[[Any], Any]:
    try:
        import uvloop  # what uvicorn serves the gateway on
    except ImportError:
        return asyncio.run
    return uvloop.run


def start_upstream(chunks: int) -> Any:
    from bench import processes

    port = processes.free_port()
    argv = [sys.executable, "-m", "bench.upstream.server", "--port", str(port), "--chunks", str(chunks)]
    log_dir = Path(tempfile.mkdtemp(prefix="bench-instr-"))
    return processes.start("upstream-instructions", argv, port, log_dir)
