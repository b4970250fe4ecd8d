"""The httpx transport does what h1 cannot, and cannot be turned against the gateway.

Over real loopback sockets: a forward/CONNECT proxy written here (asyncio), reached through a
provider's `proxy:` and through `HTTP(S)_PROXY` / `NO_PROXY`; an HTTPS upstream whose certificate
comes from a throwaway CA (trustme) trusted only through `ca_bundle`; an upstream that requires a
client certificate (mTLS); and the gateway itself, served by uvicorn, answering the official openai
client through a provider on `transport: httpx`. Then what httpx must not do for a hostile upstream:
follow a redirect with the gateway's key, keep one tenant's cookie for the next, pass a client's
Proxy-* header to the proxy, or pool a connection whose stream was closed early.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import h2.config
import h2.connection
import h2.events
import pytest
import trustme
from aiohttp import web

from gateway.config import CapsConfig, ConfigError, parse_config
from gateway.upstream.client import H1Transport, Upstream
from gateway.upstream.httpx_transport import HttpxTransport, _h11_state
from gateway.upstream.transport import Timeouts
from tests.helpers.clients import openai_client
from tests.helpers.faults import CHUNKS, RECORDED_JSON, RECORDED_SSE, RECORDED_STREAM_TEXT
from tests.helpers.servers import GatewayThread
from tests.helpers.upstreams import Received
from tests.helpers.upstreams import Upstream as ThreadedUpstream
from wire.errors import GatewayError, UpstreamConnectError
from wire.upstream import UpstreamRequest

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
TIMEOUTS = Timeouts(connect=2.0, first_byte=5.0, total=10.0)
ANSWER = b'{"via":"upstream"}'


# --------------------------------------------------------------------------------------------------
# Servers


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    peer: object


@dataclass
class Origin:
    url: str
    seen: list[Seen] = field(default_factory=list)


async def start_origin(
    tls: ssl.SSLContext | None = None, handler: Handler | None = None
) -> tuple[web.AppRunner, Origin]:
    origin = Origin("")

    async def default(request: web.Request) -> web.StreamResponse:
        return web.Response(body=ANSWER, content_type="application/json")

    async def record(request: web.Request) -> web.StreamResponse:
        await request.read()
        peer = request.transport.get_extra_info("peername") if request.transport else None
        origin.seen.append(
            Seen(request.method, request.path_qs, {k.lower(): v for k, v in request.headers.items()}, peer)
        )
        return await (handler or default)(request)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", record)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls)
    await site.start()
    port = runner.addresses[0][1]
    origin.url = f"{'https' if tls else 'http'}://{'localhost' if tls else '127.0.0.1'}:{port}"
    return runner, origin


class Proxy:
    """An HTTP proxy: CONNECT tunnels, and absolute-form requests forwarded as they are (then piped)."""

    def __init__(self) -> None:
        self.lines: list[str] = []  # the first line of every request the proxy received
        self.headers: list[dict[str, str]] = []
        self.port = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            text = head.decode("latin-1")
            first, *rest = text.split("\r\n")
            self.lines.append(first)
            self.headers.append({k.strip().lower(): v.strip() for k, _, v in (r.partition(":") for r in rest if r)})
            method, target, _ = first.split(" ")
            if method == "CONNECT":
                host, _, port = target.rpartition(":")
                up_reader, up_writer = await asyncio.open_connection(host, int(port))
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
                await writer.drain()
            else:
                url = target.removeprefix("http://")
                hostport = url.split("/", 1)[0]
                host, _, port = hostport.rpartition(":")
                up_reader, up_writer = await asyncio.open_connection(host, int(port))
                up_writer.write(head)
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass  # a cancellation is stop(): ending quietly keeps asyncio's stream callback from logging it
        finally:
            self._tasks.discard(task)
            writer.transport.abort()

    @staticmethod
    async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()
        finally:
            dst.transport.abort()


@pytest.fixture
async def proxy() -> AsyncIterator[Proxy]:
    p = Proxy()
    await p.start()
    try:
        yield p
    finally:
        await p.stop()


@dataclass
class Pki:
    ca: trustme.CA
    ca_file: Path
    server: ssl.SSLContext


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    ca = trustme.CA()
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("localhost").configure_cert(server)
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    return Pki(ca, ca_file, server)


def upstream_for(providers: str, env: dict[str, str] | None = None) -> Upstream:
    return Upstream(parse_config(f"providers:\n{providers}", env=env or {}))


async def call(upstream: Upstream, provider: str, url: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    req = UpstreamRequest(
        "POST", url + "/v1/completions", {"content-type": "application/json", **(headers or {})}, b"{}"
    )
    resp = await upstream.send(provider, req, TIMEOUTS)
    return resp.status, resp.body


# --------------------------------------------------------------------------------------------------
# What h1 cannot do


async def test_a_provider_proxy_tunnels_https_and_a_ca_bundle_trusts_a_private_ca(proxy: Proxy, pki: Pki) -> None:
    runner, origin = await start_origin(pki.server)
    try:
        up = upstream_for(f"  p: {{kind: openai, api_key: k, proxy: '{proxy.url}', ca_bundle: '{pki.ca_file}'}}")
        assert isinstance(up.transport("p"), HttpxTransport)
        try:
            assert await call(up, "p", origin.url) == (200, ANSWER)
        finally:
            await up.close()
        port = origin.url.rsplit(":", 1)[1]
        assert proxy.lines == [f"CONNECT localhost:{port} HTTP/1.1"]
        assert origin.seen[0].path == "/v1/completions"
    finally:
        await runner.cleanup()


async def test_without_the_ca_bundle_the_private_ca_is_refused(pki: Pki) -> None:
    runner, origin = await start_origin(pki.server)
    try:
        up = upstream_for("  p: {kind: openai, api_key: k, transport: httpx}")
        try:
            with pytest.raises(UpstreamConnectError, match="could not be reached"):
                await call(up, "p", origin.url)
        finally:
            await up.close()
        assert origin.seen == []
    finally:
        await runner.cleanup()


async def test_mtls_client_certificate_is_presented_only_when_configured(pki: Pki, tmp_path: Path) -> None:
    pki.server.verify_mode = ssl.CERT_REQUIRED
    pki.ca.configure_trust(pki.server)
    client = pki.ca.issue_cert("gateway-client")
    cert, key = tmp_path / "client.pem", tmp_path / "client.key"
    for blob in client.cert_chain_pems:
        with cert.open("ab") as f:
            f.write(blob.bytes())
    client.private_key_pem.write_to_path(str(key))
    runner, origin = await start_origin(pki.server)
    try:
        up = upstream_for(
            f"  m: {{kind: openai, api_key: k, ca_bundle: '{pki.ca_file}', client_cert: '{cert}',"
            f" client_key: '{key}'}}\n"
            f"  n: {{kind: openai, api_key: k, ca_bundle: '{pki.ca_file}'}}"
        )
        try:
            assert await call(up, "m", origin.url) == (200, ANSWER)
            with pytest.raises(GatewayError):
                await call(up, "n", origin.url)  # the server refuses a handshake without a client certificate
        finally:
            await up.close()
        assert len(origin.seen) == 1
    finally:
        await runner.cleanup()


async def test_http_proxy_from_the_environment_is_used_and_no_proxy_is_respected(proxy: Proxy) -> None:
    runner, origin = await start_origin()
    try:
        providers = f"  e: {{kind: openai, api_key: k, base_url: '{origin.url}/v1'}}"
        env = {"HTTP_PROXY": proxy.url, "http_proxy": proxy.url}
        with _environ(env):
            up = upstream_for(providers)
            assert isinstance(up.transport("e"), HttpxTransport)  # auto: a proxy variable applies to its host
            try:
                assert await call(up, "e", origin.url) == (200, ANSWER)
            finally:
                await up.close()
        assert proxy.lines == [f"POST {origin.url}/v1/completions HTTP/1.1"]
        proxy.lines.clear()
        with _environ({**env, "NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1"}):
            up = upstream_for(providers)
            assert isinstance(up.transport("e"), H1Transport)  # NO_PROXY covers its host: the fast client
            try:
                assert await call(up, "e", origin.url) == (200, ANSWER)
            finally:
                await up.close()
        assert proxy.lines == []
    finally:
        await runner.cleanup()


@contextlib.contextmanager
def _environ(values: dict[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in (*values, "NO_PROXY", "no_proxy")}
    for k in ("NO_PROXY", "no_proxy"):
        os.environ.pop(k, None)
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class H2Origin:
    """A minimal HTTP/2 server over TLS (ALPN `h2` only), on the `h2` state machine httpx itself uses."""

    def __init__(self, tls: ssl.SSLContext) -> None:
        tls.set_alpn_protocols(["h2"])
        self.tls = tls
        self.alpn: list[str | None] = []
        self.requests: list[dict[str, str]] = []
        self.port = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0, ssl=self.tls)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.alpn.append(writer.get_extra_info("ssl_object").selected_alpn_protocol())
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
        conn.initiate_connection()
        writer.write(conn.data_to_send())
        heads: dict[int, dict[str, str]] = {}
        try:
            while data := await reader.read(65536):
                for event in conn.receive_data(data):
                    if isinstance(event, h2.events.RequestReceived):
                        heads[event.stream_id] = {
                            (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
                            for k, v in event.headers
                        }
                    elif isinstance(event, h2.events.DataReceived):
                        conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                    elif isinstance(event, h2.events.StreamEnded):
                        self.requests.append(heads.pop(event.stream_id))
                        conn.send_headers(
                            event.stream_id,
                            [(":status", "200"), ("content-type", "application/json"), ("content-length", "18")],
                        )
                        conn.send_data(event.stream_id, ANSWER, end_stream=True)
                writer.write(conn.data_to_send())
                await writer.drain()
        except (ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.transport.abort()


async def test_http2_is_negotiated_when_asked_for(pki: Pki) -> None:
    server = H2Origin(pki.server)
    await server.start()
    try:
        url = f"https://localhost:{server.port}"
        up = upstream_for(f"  p: {{kind: openai, api_key: k, http2: true, ca_bundle: '{pki.ca_file}'}}")
        try:
            for _ in range(3):
                assert await call(up, "p", url, {"authorization": "Bearer sk-h2"}) == (200, ANSWER)
        finally:
            await up.close()
        assert server.alpn == ["h2"]  # one connection, multiplexed, over HTTP/2
        assert [r[":path"] for r in server.requests] == ["/v1/completions"] * 3
        assert server.requests[0]["authorization"] == "Bearer sk-h2"
    finally:
        await server.stop()


# --------------------------------------------------------------------------------------------------
# What httpx must not do


async def test_redirects_are_not_followed_cookies_not_kept_and_proxy_headers_not_passed(proxy: Proxy) -> None:
    elsewhere_runner, elsewhere = await start_origin()

    async def hostile(request: web.Request) -> web.StreamResponse:
        if request.path.startswith("/redirect"):
            # Points the gateway, and the credential it sends, at another host.
            raise web.HTTPTemporaryRedirect(f"{elsewhere.url}/steal")
        resp = web.Response(body=ANSWER, content_type="application/json")
        resp.set_cookie("session", "tenant-a-secret", path="/")
        return resp

    runner, origin = await start_origin(handler=hostile)
    try:
        up = upstream_for(f"  x: {{kind: openai, api_key: k, base_url: '{origin.url}/v1', proxy: '{proxy.url}'}}")
        try:
            req = UpstreamRequest("POST", origin.url + "/redirect", {"authorization": "Bearer sk-gw"}, b"{}")
            resp = await up.send("x", req, TIMEOUTS)
            assert resp.status == 307 and elsewhere.seen == []
            # Tenant A's answer sets a cookie; tenant B's request must not carry it.
            await call(up, "x", origin.url, {"proxy-authorization": "Basic c3RvbGVu", "x-tenant": "a"})
            await call(up, "x", origin.url, {"x-tenant": "b"})
        finally:
            await up.close()
        assert [s.headers.get("cookie") for s in origin.seen] == [None, None, None]
        assert all("proxy-authorization" not in h for h in proxy.headers)
        assert all("proxy-authorization" not in s.headers for s in origin.seen)
    finally:
        await runner.cleanup()
        await elsewhere_runner.cleanup()


async def test_a_stream_closed_early_closes_its_connection() -> None:
    hung_up = asyncio.Event()

    async def handler(request: web.Request) -> web.StreamResponse:
        if request.path != "/stream":
            return web.Response(body=ANSWER)
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b"data: 1\n\n")
        try:
            for _ in range(100):  # keeps writing until the peer is gone (aiohttp raises on a closed transport)
                await asyncio.sleep(0.05)
                await resp.write(b": keep-alive\n\n")
        except (ConnectionError, RuntimeError):
            hung_up.set()
        return resp

    runner, origin = await start_origin(handler=handler)
    try:
        up = upstream_for(f"  s: {{kind: openai, api_key: k, base_url: '{origin.url}/v1', transport: httpx}}")
        try:
            req = UpstreamRequest("POST", origin.url + "/stream", {}, b"{}", stream=True)
            stream = await up.open_stream("s", req, TIMEOUTS)
            assert stream.status == 200
            stream.close()  # as the pipeline does when the client leaves before the first event is read
            await asyncio.wait_for(hung_up.wait(), 3)  # the upstream saw the connection go
            assert await call(up, "s", origin.url) == (200, ANSWER)
        finally:
            await up.close()
        assert origin.seen[0].peer != origin.seen[1].peer  # the half-read connection was not reused
    finally:
        await runner.cleanup()


async def test_the_h11_state_the_wrapper_seals_is_still_reachable() -> None:
    """`_seal` keeps a connection with leftover bytes out of the pool through httpx/httpcore internals;
    this fails if an upgrade moves them, rather than letting that protection lapse silently."""
    runner, origin = await start_origin()
    try:
        t = HttpxTransport(
            parse_config("providers: {p: {kind: openai, api_key: k}}", env={}).providers["p"], CapsConfig()
        )
        try:
            reply = await t.request(UpstreamRequest("POST", origin.url + "/", {}, b"{}"), TIMEOUTS)
            assert _h11_state(reply._resp) is not None
            assert await reply.read() == ANSWER
        finally:
            await t.close()
    finally:
        await runner.cleanup()


# --------------------------------------------------------------------------------------------------
# Config


@pytest.mark.parametrize(
    ("setting", "path"),
    [
        ("proxy: 'http://127.0.0.1:1'", "providers.p.proxy"),
        ("http2: true", "providers.p.http2"),
        ("ca_bundle: '{ca}'", "providers.p.ca_bundle"),
        ("client_cert: '{ca}'", "providers.p.client_cert"),
    ],
)
def test_h1_with_what_only_httpx_can_do_is_a_config_error(setting: str, path: str, pki: Pki) -> None:
    text = f"providers:\n  p: {{kind: openai, api_key: k, transport: h1, {setting.format(ca=pki.ca_file)}}}\n"
    with pytest.raises(ConfigError) as info:
        parse_config(text, "gw.yaml", env={})
    message = str(info.value)
    assert message.startswith(f"gw.yaml: {path}: ") and "httpx" in message and "\n" not in message


def test_proxy_credentials_never_appear_in_a_config_error() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config("providers:\n  p: {kind: openai, api_key: k, proxy: 'socks9://user:hunter2@h:1'}\n", env={})
    assert "hunter2" not in str(info.value) and "providers.p.proxy" in str(info.value)


def test_a_missing_ca_bundle_is_a_config_error_naming_it() -> None:
    with pytest.raises(ConfigError, match=r"providers\.p\.ca_bundle: no such file"):
        parse_config("providers:\n  p: {kind: openai, api_key: k, ca_bundle: /nonexistent/ca.pem}\n", env={})


def test_auto_picks_h1_unless_httpx_is_needed(pki: Pki) -> None:
    with _environ({}):
        up = upstream_for(
            "  plain: {kind: openai, api_key: k, base_url: 'http://127.0.0.1:9/v1'}\n"
            "  h2: {kind: openai, api_key: k, http2: true}\n"
            f"  ca: {{kind: openai, api_key: k, ca_bundle: '{pki.ca_file}'}}\n"
            "  forced: {kind: openai, api_key: k, transport: httpx}\n"
        )
    assert isinstance(up.transport("plain"), H1Transport)
    assert all(isinstance(up.transport(n), HttpxTransport) for n in ("h2", "ca", "forced"))


# --------------------------------------------------------------------------------------------------
# End to end: the gateway on uvicorn, the official client, a provider on httpx


@pytest.fixture
def e2e_upstream() -> Iterator[ThreadedUpstream]:
    with ThreadedUpstream() as server:
        yield server


def test_a_completion_and_a_stream_through_the_gateway_on_httpx(e2e_upstream: ThreadedUpstream, tmp_path: Path) -> None:
    async def handler(request: web.Request, received: Received) -> web.StreamResponse:
        body = json.loads(await request.read() or b"{}")
        if body.get("stream"):
            resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
            await resp.prepare(request)
            await resp.write(RECORDED_SSE)
            await resp.write_eof()
            return resp
        return web.Response(body=RECORDED_JSON, content_type="application/json")

    e2e_upstream.handler = handler
    config = tmp_path / "gw.yaml"
    config.write_text(
        "keys: [{name: t, key: gk-transport-e2e}]\n"
        "retries: {attempts: 1}\n"
        f"providers:\n  up: {{kind: openai, api_key: sk-up, base_url: '{e2e_upstream.url}/v1', transport: httpx}}\n"
    )
    gw = GatewayThread(config, {})
    gw.start()
    try:
        assert isinstance(gw.pipeline.upstream.transport("up"), HttpxTransport)
        client = openai_client(gw.url + "/v1", "gk-transport-e2e")
        done = client.completions.create(model="up/davinci-002", prompt="Say hello", max_tokens=16)
        assert done.choices[0].text == json.loads(RECORDED_JSON)["choices"][0]["text"]
        texts = [
            c.choices[0].text
            for c in client.completions.create(model="up/davinci-002", prompt="Say hello", max_tokens=16, stream=True)
            if c.choices
        ]
        assert "".join(texts) == RECORDED_STREAM_TEXT and len(texts) == len(CHUNKS)
        assert [r.headers["authorization"] for r in e2e_upstream.received] == ["Bearer sk-up"] * 2
    finally:
        gw.stop()
