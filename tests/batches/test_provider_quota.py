"""A line refused because its provider is at the quota the config gives it (429 `provider_quota`) is a line
the gateway had no room for, as one over its key's rate limit: it is put back and sent again after the
refusal's Retry-After, never written to the error file while the batch's window lasts."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.helpers.servers import GatewayThread

from .conftest import ENV, EVAL_KEY, config, line, results, sdk, start, wait_batch


def test_a_line_over_its_providers_quota_is_sent_again_later(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    pair = "  - {name: pair, targets: [{model: demo/text}, {model: demo/slow-40ms}]}"
    text = (
        config(f"sqlite:///{tmp_path / 'ledger.db'}", concurrency=8)
        .replace(
            "demo: {kind: fake, models: [text, slow-40ms, slow-400ms]}",
            "demo: {kind: fake, models: [text, slow-40ms, slow-400ms], limits: {rps: 5}}",
        )
        .replace("models:\n", "models:\n" + pair + "\n")
    )
    assert "limits: {rps: 5}" in text
    path.write_text(text)
    lines = [line(f"pq-{i}", model="pair", prompt=f"p {i}") for i in range(12)]
    with GatewayThread(path, ENV) as gw:
        client = sdk(gw.url, EVAL_KEY)
        batch = wait_batch(client, start(client, lines))
        out = results(client, batch.output_file_id)
        err = results(client, batch.error_file_id)
        text = httpx.get(gw.url + "/metrics").text
    assert [e["response"]["body"]["error"]["code"] for e in err] == []
    assert batch.status == "completed" and batch.error_file_id is None
    assert [o["custom_id"] for o in out] == [x["custom_id"] for x in lines]
    refused = [
        x for x in text.splitlines() if x.startswith('gateway_batch_lines_requeued_total{code="provider_quota"}')
    ]
    assert refused and float(refused[0].rsplit(" ", 1)[1]) >= 1
