"""The config block of the caps: `caps:` (typed, checked at load).

What one request or one upstream answer may make the gateway hold or do; each field's meaning and default is
in docs/config.md and docs/security.md. The block lives here, with the rest of the typed config, so that the
config imports nothing above it.
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta


class CapsConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """What one request or one upstream answer may make the gateway hold or do (docs/security.md)."""

    # -- upstream answers --
    # A buffered upstream body, counted after gzip/deflate decoding (a decompression bomb stops here).
    upstream_body_bytes: Annotated[int, Meta(ge=1024)] = 64 * 1024 * 1024
    # One stream line or event (SSE, NDJSON), after decoding.
    upstream_event_bytes: Annotated[int, Meta(ge=1024)] = 1024 * 1024
    # Stream bytes since the last event that carried anything for the client (text, a choice, usage, a finish):
    # blank lines, comments and events the adapter ignores, each of which resets the read timeout. An event still
    # arriving is not counted (`upstream_event_bytes` bounds it). Keep-alive pings are bytes every few seconds.
    upstream_idle_stream_bytes: Annotated[int, Meta(ge=1024)] = 1024 * 1024
    # The status line and headers of one upstream answer, and the interim (1xx) answers before them.
    upstream_header_bytes: Annotated[int, Meta(ge=1024)] = 64 * 1024
    # Interim (1xx) answers before one upstream answer's final head (100 Continue, 103 Early Hints).
    upstream_interim_answers: Annotated[int, Meta(ge=0)] = 10
    # Upstream error text relayed to a client or a log, after secrets are scrubbed from it.
    upstream_message_chars: Annotated[int, Meta(ge=64)] = 1000
    # -- client requests --
    request_body_bytes: Annotated[int, Meta(ge=1024)] = 8 * 1024 * 1024
    # Nesting of JSON values inside free-form fields (`response_format`, `inference_extra_params`, ...).
    json_depth: Annotated[int, Meta(ge=2, le=1000)] = 64
    # Completion tokens a budget reserves per choice for a request that sets no max_tokens (nothing else bounds
    # its answer but the model's context); an answer past it is charged in full (docs/ledger.md#budgets).
    budget_max_tokens: Annotated[int, Meta(ge=1)] = 4096
    # A chat request's messages, and their content parts together: each one is walked, rendered, counted and
    # translated on the event loop, and the body cap alone lets through some 290,000 one-word messages.
    chat_messages: Annotated[int, Meta(ge=1)] = 10_000
    chat_content_parts: Annotated[int, Meta(ge=1)] = 10_000
    # Prompt tokens token limits and budgets count for each image a request sends (a chat's image parts, a
    # completion's `images`): the gateway sees no pixels to count them by. OpenAI's gpt-4o family bills a
    # high-detail image 85 + 170 per 512-px tile, at most 1,445; Anthropic about width x height / 750, at most
    # about 1,600 once resized; self-hosted models may take far more (Qwen2-VL up to 16,384 by default): raise
    # it for those (docs/ratelimits.md).
    image_tokens: Annotated[int, Meta(ge=0)] = 1600
    # A client-supplied pattern (`guided_regex`, a JSON-schema `pattern`), in characters.
    pattern_chars: Annotated[int, Meta(ge=16)] = 4096
    # Stop sequences the gateway enforces itself (beyond a provider's count, or kept where it strips them),
    # in characters together: their automaton is built from them once per request.
    stop_chars: Annotated[int, Meta(ge=16)] = 8 * 1024
    # Keyword evaluations (about 10 us each) one request may spend checking its answers against a client's
    # JSON Schema (`guided_json`, `response_format`): all its choices and retries together.
    guided_work: Annotated[int, Meta(ge=1000)] = 200_000
    # The most subschemas a client's schema may apply to one value through `$ref`s and in-place branches
    # (`anyOf`, `allOf`, `oneOf`, `not`, `if`): shared `$ref` targets multiply them.
    schema_paths: Annotated[int, Meta(ge=1)] = 1000
    # The text an emulated answer may build (echo x n x prompts, best_of fan-outs), in bytes.
    emulated_answer_bytes: Annotated[int, Meta(ge=1024)] = 16 * 1024 * 1024
    # Tokens the built-in `fake` provider generates for one choice.
    fake_max_tokens: Annotated[int, Meta(ge=1)] = 4096
    # Token ids one `/detokenize` request may send: the upstream decodes every one of them (vLLM puts no bound
    # of its own on the list), so one tenant's 8 MiB body of ids (about 4 million) would keep a shared server's
    # front end busy. 1 Mi: the longest context self-hosted models commonly serve.
    detokenize_tokens: Annotated[int, Meta(ge=1)] = 1024 * 1024
    # Token ids one completion request's `prompt` may hold, all its prompts together: likewise read by the
    # upstream one by one and bounded by nothing else but the body.
    prompt_token_ids: Annotated[int, Meta(ge=1)] = 1024 * 1024
    # Token ids `stop_token_ids` and `allowed_token_ids` may each hold, and entries `logit_bias` may have: each
    # names a token of the vocabulary, and 262,144 is about the largest vocabulary in common use (Gemma 3's).
    param_token_ids: Annotated[int, Meta(ge=1)] = 262_144
    # Characters of text one `/tokenize` request may send (its `prompt`, or its messages' text): the upstream
    # tokenizes all of it. 4 Mi: about the 1 Mi tokens of the longest context, at about 4 characters a token.
    tokenize_chars: Annotated[int, Meta(ge=1)] = 4 * 1024 * 1024
