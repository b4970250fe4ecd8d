"""Reference floor: the thinnest honest Python proxy for POST /v1/completions.

It does the minimum any gateway must do - decode the client JSON, re-encode it, forward it over
one pooled aiohttp ClientSession, decode and re-encode the answer (every SSE event when
streaming) - and nothing else. Whatever the gateway costs beyond this is the price of its
features, which is why the bench reports gateway figures against this one as well as direct.

It answers /v1/chat/completions the same way, forwarded to the same path upstream. With ``--workers N``
it runs N processes sharing the port (SO_REUSEPORT), the floor for a gateway with N workers.

Run: ``python -m bench.passthrough --port 9100 --upstream http://127.0.0.1:9000``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys

import aiohttp
import msgspec
import uvloop
from aiohttp import web

_SESSION = web.AppKey("session", aiohttp.ClientSession)
_UPSTREAM = web.AppKey("upstream", str)


async def completions(request: web.Request) -> web.StreamResponse:
    payload = msgspec.json.decode(await request.read())
    session, url = request.app[_SESSION], request.app[_UPSTREAM] + request.path
    headers = {"Content-Type": "application/json", "Authorization": "Bearer bench-key"}
    async with session.post(url, data=msgspec.json.encode(payload), headers=headers) as upstream:
        if not (isinstance(payload, dict) and payload.get("stream")):
            body = msgspec.json.encode(msgspec.json.decode(await upstream.read()))
            return web.Response(body=body, status=upstream.status, content_type="application/json")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        async for line in upstream.content:
            if line.startswith(b"data: ") and line.strip() != b"data: [DONE]":
                line = b"data: " + msgspec.json.encode(msgspec.json.decode(line[6:])) + b"\n\n"
            elif line.strip():
                line += b"\n"
            else:
                continue
            await response.write(line)
        await response.write_eof()
        return response


async def health(_: web.Request) -> web.Response:
    return web.Response(text="ok")


async def serve(host: str, port: int, upstream: str, reuse_port: bool = False) -> None:
    app = web.Application()
    app[_UPSTREAM] = upstream.rstrip("/")
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", completions)
    app.router.add_get("/health", health)
    # No pool cap (aiohttp's default is 100): with many streams open at once a cap would queue them
    # here, and the bench would measure the cap instead of what holding them costs.
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        app[_SESSION] = session
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, host, port, backlog=4096, reuse_port=reuse_port).start()
        try:
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="base URL without /v1, e.g. http://127.0.0.1:9000")
    parser.add_argument("--workers", type=int, default=1, help="processes sharing the port (SO_REUSEPORT)")
    args = parser.parse_args(argv)
    reuse = args.workers > 1 or os.environ.get("BENCH_PASSTHROUGH_CHILD") == "1"
    children = [
        # Children share this process group, so stopping the bench's target stops them too.
        subprocess.Popen(
            [sys.executable, "-m", "bench.passthrough", "--host", args.host, "--port", str(args.port)]
            + ["--upstream", args.upstream],
            env={**os.environ, "BENCH_PASSTHROUGH_CHILD": "1"},
        )
        for _ in range(args.workers - 1)
    ]
    # uvloop because the gateway runs on it too; the floor should not be handicapped by the loop.
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        try:
            runner.run(serve(args.host, args.port, args.upstream, reuse))
        finally:
            for child in children:
                child.terminate()


if __name__ == "__main__":
    main()
