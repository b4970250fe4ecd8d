"""One line of a batch, sent through the request path exactly as the batch's key would send it interactively.

The pipeline serving now (a reload's too) decodes, authorizes, budgets, routes, caches and fails over the line
as it does a request to the batch's endpoint (the same `Operation`); what the endpoint does around a request
(usage, metrics, the access log, the ledger's row, the trace) is done here too, with the batch's id on the
record, which marks it a batch's line to the pipeline: it waits below every interactive request (the `batch`
class) and counts toward `batches.limits`, not its key's rate limits (its budgets, yes).

An answered line's ledger row goes with its `Sent`, not to the writer: the runner's store commits it in the
transaction that books the line (`store.record`): one row per line booked, whatever kills the process. A line
put back (`LATER_CODES`) or cut by a stop or a lost lease is sent again: no row, no request metrics. A line
cut by its batch's end is never sent again: its 499 row goes to the writer. docs/batches.md.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, Final

from gateway.batches.objects import ERR, LATER, NO_TOKENS, OK, Booked, Tokens, answered
from gateway.ids import unique_suffix
from gateway.limits.auth import ClientKey
from gateway.ops import accesslog
from gateway.ops.metrics import Metrics, Record
from gateway.path.dialects import OPENAI
from gateway.path.operation import CHAT, COMPLETIONS
from gateway.path.pipeline import Pipeline
from gateway.path.synonyms import as_sent
from wire.errors import GatewayError, InvalidRequestError
from wire.schema import Usage

log = logging.getLogger("gateway")
# The endpoints a batch may name, each with the steps its interactive route runs (OpenAI's names; OpenAI's
# embeddings and responses endpoints are not served here, so a batch of them is refused when it is made).
ENDPOINTS: Final = {"/v1/completions": COMPLETIONS, "/v1/chat/completions": CHAT}
BUDGET_CODE: Final = "budget_exceeded"
# The gateway had no room for the line now and called no upstream (a server's queue, a rate limit, a
# provider's configured quota: 429s; every target cooling down: a 429 after upstream rate limits, else a 503;
# every replica of a fleet draining, as in a rolling restart: a 503):
# nothing is wrong with the line, so it is sent again later rather than written to the error file (the runner
# backs off, up to its window), as an interactive client told Retry-After would.
LATER_CODES: Final = frozenset(
    {"queue_timeout", "queue_full", "rate_limit_exceeded", "provider_quota", "all_targets_cooling", "replicas_draining"}
)
_INTERNAL: Final = GatewayError("The gateway failed to process the request", code="internal_error")
# The message the runner cancels a line with when its batch ends (`Task.cancel`): the line is never sent
# again, so it is booked as a request cut off (499). Any other cancel (a stop, a lease lost) sends it again.
ENDED: Final = "batch ended"


class Sent:
    """A line's outcome: its state (ok, err, or later: to be sent again), its result line, the refusal that
    stops the batch, if any, for a line to send later, why and the wait its refusal asked for, and its
    ledger row (`Ledger.hold`), to commit with it."""

    __slots__ = ("code", "result", "retry_after", "row", "state", "stop", "tokens")

    def __init__(
        self,
        state: str,
        result: bytes,
        stop: str | None = None,
        code: str | None = None,
        retry_after: float | None = None,
        tokens: Tokens = NO_TOKENS,
    ) -> None:
        self.state = state
        self.result = result
        self.stop = stop
        self.code = code
        self.retry_after = retry_after
        self.tokens = tokens
        self.row: tuple[Any, ...] | None = None

    def booked(self, idx: int) -> Booked:
        """What the batch's store books of this line, at its place `idx` in the file."""
        return idx, self.state, self.result.decode(), self.tokens, self.row


def tokens_of(usage: Usage | None) -> Tokens:
    """An answer's usage as the batch sums it: input, cached input, output and reasoning tokens.

    The two totals are already bounded (`sane_usage`); an upstream's details are not, so each is held within
    its total: a sum over a batch's lines stays far inside the database's 64-bit column."""
    if usage is None:
        return NO_TOKENS
    prompt, completion = usage.prompt_tokens, usage.completion_tokens
    cached = usage.prompt_tokens_details.cached_tokens if usage.prompt_tokens_details is not None else None
    reasoning = (
        usage.completion_tokens_details.reasoning_tokens if usage.completion_tokens_details is not None else None
    )
    return prompt, min(max(cached or 0, 0), prompt), completion, min(max(reasoning or 0, 0), completion)


Owner = Callable[[Pipeline], ClientKey | None]


async def send(
    pipeline: Pipeline,
    metrics: Metrics | None,
    key: ClientKey | None,
    batch_id: str,
    custom_id: str,
    body: bytes | None,
    endpoint: str,
) -> Sent:
    """Send the line; `body` None is one over `caps.request_body_bytes`, left unread in the database."""
    op = ENDPOINTS[endpoint]
    line_id = "batch_req_" + unique_suffix()
    rec = Record(request_id=line_id, dialect=OPENAI.name, batch_id=batch_id, endpoint=op.name)
    headers = {"x-request-id": line_id}
    t0 = time.perf_counter()
    sent: Sent | None = None  # None: cut off
    counted = True  # booked in the ledger and the request metrics (not when it is to be sent again)
    pipeline.enter()
    tracer = pipeline.tracing
    span = tracer.begin(headers, OPENAI.name, endpoint, False, op.genai) if tracer is not None else None
    try:
        try:
            limit = pipeline.loaded.config.caps.request_body_bytes
            if body is None or len(body) > limit:  # the bound an interactive request meets at the door
                raise InvalidRequestError(
                    f"The request body is larger than {limit} bytes", status=413, code="request_too_large"
                )
            front = pipeline.front_as(key, body, rec, op)
            result = await pipeline.complete(body, headers, OPENAI, rec, front, op)
        except GatewayError as exc:
            if exc.param is not None and body is not None:
                exc = as_sent(exc, body)  # a folded field, named as the line sent it (as the endpoint does)
            status, error_body = OPENAI.error(exc)
            rec.status, rec.error_code, rec.cause = status, exc.code, exc.cause
            rec.attempts = exc.attempts or rec.attempts
            if exc.target is not None and not rec.provider:
                rec.provider, rec.target, rec.failed = exc.provider or "", exc.target, True
            if status in (429, 503) and exc.code in LATER_CODES:
                counted = False
                # A 503's Retry-After is how long a probe of a failing target may take at most (up to the
                # plan's first-byte timeout, minutes): the line is tried again at the backoff's pace instead.
                wait = exc.retry_after if status == 429 else None
                sent = Sent(LATER, b"", code=exc.code, retry_after=wait)
                return sent
            stop = f"{exc.message}" if exc.code == BUDGET_CODE else None
            sent = Sent(ERR, answered(line_id, custom_id, status, line_id, error_body), stop)
            return sent
        except asyncio.CancelledError as exc:
            rec.status, rec.error_code = 499, "client_closed_request"
            counted = exc.args == (ENDED,)
            raise
        except Exception:
            log.exception("unhandled error on batch %s line %s", batch_id, custom_id)
            rec.status, rec.error_code = 500, "internal_error"
            status, error_body = OPENAI.error(_INTERNAL)
            sent = Sent(ERR, answered(line_id, custom_id, status, line_id, error_body))
            return sent
        sent = Sent(OK, answered(line_id, custom_id, 200, line_id, result.body), tokens=tokens_of(rec.usage))
        return sent
    finally:
        pipeline.usage.book(rec)  # settles a budget's hold; a line no target served books no usage
        pipeline.exit()
        elapsed = time.perf_counter() - t0
        if metrics is not None and counted:
            metrics.observe(rec, elapsed)
        if pipeline.log_requests:
            accesslog.write(rec, elapsed)
        if pipeline.ledger is not None and counted:
            if sent is None:
                pipeline.ledger.append(rec, elapsed)  # cut off by its batch's end: it has no answer to book with
            else:
                sent.row = pipeline.ledger.hold(rec, elapsed)  # the runner releases it once booked (or not)
                if rec.lost is not None:
                    pipeline.ledger.append_lost(rec, elapsed)  # hedges that lost: booked by the writer
        if span is not None:
            span.end(rec)
