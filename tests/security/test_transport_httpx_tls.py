"""The httpx transport does what h1 cannot, over real loopback sockets.

A forward/CONNECT proxy written here (asyncio), reached through a provider's `proxy:` and through
`HTTP(S)_PROXY` / `NO_PROXY`; an HTTPS upstream whose certificate comes from a throwaway CA (trustme)
trusted only through `ca_bundle`; an upstream that requires a client certificate (mTLS); HTTP/2 when asked.
"""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import h2.config
import h2.connection
import h2.events
import pytest

from gateway.upstream.client import H1Transport
from gateway.upstream.httpx_transport import HttpxTransport
from tests.security.httpx_rig import ANSWER, Pki, Proxy, call, patched_environ, start_origin, upstream_for
from wire.errors import GatewayError, UpstreamConnectError

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
        with patched_environ(env):
            up = upstream_for(providers)
            assert isinstance(up.transport("e"), HttpxTransport)  # auto: a proxy variable applies to its host
            try:
                assert await call(up, "e", origin.url) == (200, ANSWER)
            finally:
                await up.close()
        assert proxy.lines == [f"POST {origin.url}/v1/completions HTTP/1.1"]
        proxy.lines.clear()
        with patched_environ({**env, "NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1"}):
            up = upstream_for(providers)
            assert isinstance(up.transport("e"), H1Transport)  # NO_PROXY covers its host: the fast client
            try:
                assert await call(up, "e", origin.url) == (200, ANSWER)
            finally:
                await up.close()
        assert proxy.lines == []
    finally:
        await runner.cleanup()


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
