"""The shared OpenAI-compatible base against servers with no adapter of their own: HF TGI's `/v1/completions`
(snapshot: empty id, system_fingerprint) and TGI's `{"error", "error_type"}` error body."""

from __future__ import annotations

from providers.base import Endpoint
from providers.vllm import VLLMAdapter
from tests.helpers.adapters import as_json, context
from tests.helpers.recordings import fixture_bytes
from wire.errors import UpstreamStatusError

# TGI is served the way any self-hosted OpenAI-compatible server is: through the vLLM kind's base parser.
ADAPTER = VLLMAdapter()
ENDPOINT = Endpoint(provider="tgi", model="meta-llama/Llama-3.1-8B-Instruct", base_url="http://tgi:8080/v1")


def test_tgi_snapshot_empty_id_replaced_fingerprint_kept() -> None:
    out = ADAPTER.parse_response(
        fixture_bytes("tgi/snapshot_v1_completions_single.json"), context(["What is Deep Learning?"])
    )
    assert as_json(out) == {
        "object": "text_completion",
        "id": "cmpl-gateway-test-id",
        "created": 1741264812,
        "model": "client/model-string",
        "system_fingerprint": "3.1.2-dev0-native",
        "choices": [
            {
                "text": " A Beginner’s Guide\nDeep learning is a subset",
                "index": 0,
                "logprobs": None,
                "finish_reason": "length",
            }
        ],
        "usage": {"prompt_tokens": 6, "completion_tokens": 10, "total_tokens": 16},
    }


def test_tgi_validation_error_string_body() -> None:
    err = ADAPTER.map_error(422, {}, fixture_bytes("tgi/error_422_validation.json"), "tgi")
    assert isinstance(err, UpstreamStatusError)
    assert (err.status, err.upstream_status, err.type) == (422, 422, "invalid_request_error")
    assert err.message == (
        "tgi error (422): Input validation error: `inputs` tokens + `max_new_tokens` must be <= 1512. "
        "Given: 2 `inputs` tokens and 10000 `max_new_tokens`"
    )
    assert err.code is None
    assert err.param is None
    assert err.retry_after is None


def test_created_falls_back_to_the_call_time_when_missing() -> None:
    # Same recording with `created` removed: the parser must not emit 0.
    body = fixture_bytes("vllm/completion_opt125m.json").replace(b'"created":1729072359,', b"")
    out = ADAPTER.parse_response(body, context())
    assert out.created == 1_700_000_000
