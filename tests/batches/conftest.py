"""The Batch API suite's config and helpers: the real gateway, a real SQLite file, the `openai` SDK unmodified."""

from __future__ import annotations

import contextlib
import io
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

import httpx
import openai
import pytest

from tests.helpers.clients import openai_client
from tests.helpers.postgres import PostgresServer
from tests.helpers.redis import RedisServer
from tests.helpers.servers import GatewayThread

ADMIN_KEY: Final = "adm-batches-5e1c"
EVAL_KEY: Final = "gk-batches-eval-7a21"
OTHER_KEY: Final = "gk-batches-other-c3d9"
ENV: Final = {"BATCH_ADMIN_KEY": ADMIN_KEY, "BATCH_EVAL_KEY": EVAL_KEY, "BATCH_OTHER_KEY": OTHER_KEY}

CONFIG: Final = """
admin: {{key: "${{BATCH_ADMIN_KEY}}"}}
logging: {{requests: false}}
retries: {{attempts: 1}}
ledger: {{url: "{url}", flush_ms: 100}}
batches: {{poll_ms: 100, lease_ms: {lease_ms}, concurrency: {concurrency}{extra}}}
keys:
  - {{name: eval, key: "${{BATCH_EVAL_KEY}}"}}
  - {{name: other, key: "${{BATCH_OTHER_KEY}}", models: [fast]}}
providers:
  demo: {{kind: fake, models: [text, slow-40ms, slow-400ms]}}
{more}
models:
  - {{name: fast, targets: [{{model: demo/text}}]}}
  - {{name: slow, targets: [{{model: demo/slow-40ms}}]}}
  - {{name: slower, targets: [{{model: demo/slow-400ms}}]}}
"""


def config(url: str, *, lease_ms: int = 30_000, concurrency: int = 32, extra: str = "", more: str = "") -> str:
    return CONFIG.format(url=url, lease_ms=lease_ms, concurrency=concurrency, extra=extra, more=more)


def share_config(tmp_path: Path, share: float, rds: RedisServer | None = None, more: str = "") -> str:
    """The config of the shared-quota tests: the suite's, on a SQLite ledger under `tmp_path`, 8 lines at once,
    `batches.quota_share: share`, `more` (YAML lines), and Redis failing closed when `rds` is given."""
    if rds is not None:
        more += f"\nredis: {{url: '{rds.url}', on_failure: fail_closed}}"
    return config(f"sqlite:///{tmp_path / 'ledger.db'}", concurrency=8, extra=f", quota_share: {share}", more=more)


def team_config(tmp_path: Path, limits: str, share: float = 0.5, rds: RedisServer | None = None) -> str:
    """`share_config` with both of the suite's keys in the team `evals`, whose `limits` are given (YAML flow)."""
    text = share_config(tmp_path, share, rds, f"teams: {{evals: {{limits: {{{limits}}}}}}}")
    for key in ('key: "${BATCH_EVAL_KEY}"', 'key: "${BATCH_OTHER_KEY}"'):
        assert key in text
        text = text.replace(key, key + ", team: evals")
    return text


def written(tmp_path: Path, text: str) -> Path:
    """`text` as the config file of a gateway under `tmp_path`."""
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The ledger's URL, once a SQLite file under `tmp_path` and once the suite's PostgreSQL (a module that needs
    more of its database defines its own)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'ledger.db'}"
    pg: PostgresServer = request.getfixturevalue("pg")
    return pg.url


_MADE: list[openai.OpenAI] = []


def sdk(base: str, key: str) -> openai.OpenAI:
    """The SDK on the gateway as `key`; closed when the test ends (`_close_clients`), so none of its pooled
    sockets is left for a later test's collection to find unclosed."""
    made = openai_client(base + "/v1", key, timeout=30)
    _MADE.append(made)
    return made


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    yield
    while _MADE:
        _MADE.pop().close()


def line(custom_id: str, model: str = "fast", prompt: str = "hello", **body: Any) -> dict[str, Any]:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/completions",
        "body": {"model": model, "prompt": prompt, "max_tokens": 5, **body},
    }


def jsonl(lines: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(x).encode() + b"\n" for x in lines)


def upload(client: openai.OpenAI, data: bytes) -> str:
    return client.files.create(file=("input.jsonl", io.BytesIO(data)), purpose="batch").id


def interactive(gw: GatewayThread, count: int) -> list[int]:
    """`count` requests of the batch's key (`EVAL_KEY`) to the alias `fast`, one after the other: their statuses."""
    with httpx.Client(base_url=gw.url, timeout=30) as http:
        return [
            http.post(
                "/v1/completions",
                json={"model": "fast", "prompt": f"inter {i}", "max_tokens": 5},
                headers={"authorization": f"Bearer {EVAL_KEY}"},
            ).status_code
            for i in range(count)
        ]


def wait_batch(
    client: openai.OpenAI, batch_id: str, done: Callable[[Any], bool] | None = None, timeout: float = 60
) -> Any:
    """Poll the batch as a client would until it ends (or `done` says so)."""
    deadline = time.monotonic() + timeout
    while True:
        batch = client.batches.retrieve(batch_id)
        if (done or (lambda b: b.status in ("completed", "failed", "expired", "cancelled")))(batch):
            return batch
        assert time.monotonic() < deadline, f"batch still {batch.status}: {batch.request_counts}"
        time.sleep(0.1)


def completed(client: openai.OpenAI, batch_id: str) -> int:
    """The batch's lines answered so far (`request_counts.completed`)."""
    counts = client.batches.retrieve(batch_id).request_counts
    assert counts is not None
    return counts.completed


def requeued(gw: GatewayThread, code: str) -> float:
    """The lines put back to be sent again for `code` (`gateway_batch_lines_requeued_total`), all batches'."""
    prefix = f'gateway_batch_lines_requeued_total{{code="{code}"}}'
    text = httpx.get(gw.url + "/metrics").text
    return sum(float(x.rsplit(" ", 1)[1]) for x in text.splitlines() if x.startswith(prefix))


def results(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    text = client.files.content(file_id).text
    return [json.loads(x) for x in text.splitlines()]


def start(client: openai.OpenAI, lines: list[dict[str, Any]], window: str = "24h") -> str:
    """Upload the lines and make a batch of them, as a client would; the batch's id."""
    file_id = upload(client, jsonl(lines))
    made = client.batches.create(
        input_file_id=file_id,
        endpoint="/v1/completions",
        completion_window=window,  # type: ignore[arg-type]  # the SDK's type says 24h; the gateway takes more
    )
    return made.id


@contextlib.contextmanager
def served(tmp_path: Path, **settings: Any) -> Iterator[tuple[GatewayThread, openai.OpenAI]]:
    """The gateway in a thread on a fresh SQLite ledger (`config(**settings)`), and the eval key's SDK client."""
    with GatewayThread(written(tmp_path, config(f"sqlite:///{tmp_path / 'ledger.db'}", **settings)), ENV) as gw:
        yield gw, sdk(gw.url, EVAL_KEY)
