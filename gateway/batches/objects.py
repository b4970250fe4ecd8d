"""The OpenAI Files and Batches objects as the gateway answers them, and the lines of the result files.

Field for field as OpenAI's API reference gives them (the `openai` SDK reads these unchanged):
timestamps are Unix seconds, an absent one is null, `request_counts` counts the batch's lines.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

# The statuses a runner still has work in: it claims such a batch, and resumes one whose lease ran out.
ACTIVE: Final = ("validating", "in_progress", "finalizing", "cancelling")
TERMINAL: Final = ("completed", "failed", "expired", "cancelled")

# A line's state in `batch_lines`: waiting, handed to the request path, answered (output), refused (error file).
TODO: Final = "todo"
SENT: Final = "sent"
OK: Final = "ok"
ERR: Final = "err"
# Not a state in the database: a line the gateway had no room for, which stays `sent` there while its runner
# holds it to send again (a runner that takes the batch over sends it again too).
LATER: Final = "later"

# A line's answer's tokens as its batch sums them: input, cached input, output, reasoning.
Tokens = tuple[int, int, int, int]
NO_TOKENS: Final[Tokens] = (0, 0, 0, 0)
# A line's outcome as the store books it: its place in the file, its state, its result line, its tokens, and
# its ledger row (`Ledger.hold`; None: it has none), committed with it.
Booked = tuple[int, str, str, Tokens, tuple[Any, ...] | None]


class FileObject(msgspec.Struct, omit_defaults=False):
    id: str
    bytes: int
    created_at: int
    filename: str
    purpose: str
    object: str = "file"
    status: str = "processed"
    status_details: str | None = None
    expires_at: int | None = None


class BatchError(msgspec.Struct):
    code: str
    message: str
    param: str | None = None
    line: int | None = None


class ErrorList(msgspec.Struct):
    data: list[BatchError]
    object: str = "list"


class RequestCounts(msgspec.Struct):
    total: int
    completed: int
    failed: int


class InputTokensDetails(msgspec.Struct):
    cached_tokens: int


class OutputTokensDetails(msgspec.Struct):
    reasoning_tokens: int


class BatchUsage(msgspec.Struct):
    """The tokens of the batch's answers, as their `usage` in the output file reports them."""

    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class BatchObject(msgspec.Struct):
    id: str
    endpoint: str
    # The model every line names (null until the file is checked, and where lines name different models).
    model: str | None
    errors: ErrorList | None
    input_file_id: str
    completion_window: str
    status: str
    output_file_id: str | None
    error_file_id: str | None
    created_at: int
    in_progress_at: int | None
    expires_at: int | None
    finalizing_at: int | None
    completed_at: int | None
    failed_at: int | None
    expired_at: int | None
    cancelling_at: int | None
    cancelled_at: int | None
    request_counts: RequestCounts
    metadata: dict[str, str] | None
    usage: BatchUsage
    object: str = "batch"


class Page(msgspec.Struct):
    data: list[Any]
    first_id: str | None
    last_id: str | None
    has_more: bool
    object: str = "list"


class Deleted(msgspec.Struct):
    id: str
    deleted: bool
    object: str = "file"


# -- the lines of the output and error files


class LineResponse(msgspec.Struct):
    status_code: int
    request_id: str
    body: msgspec.Raw  # the answer (or error) exactly as an interactive request got it: never decoded again


class LineError(msgspec.Struct):
    code: str
    message: str


class ResultLine(msgspec.Struct, omit_defaults=False):
    id: str
    custom_id: str
    response: LineResponse | None
    error: LineError | None


_encode = msgspec.json.Encoder().encode


def answered(line_id: str, custom_id: str, status: int, request_id: str, body: bytes) -> bytes:
    """A line the request path answered (2xx: the output file; else the error file), as one JSON line."""
    return _encode(ResultLine(line_id, custom_id, LineResponse(status, request_id, msgspec.Raw(body)), None))


def unanswered(line_id: str, custom_id: str, code: str, message: str) -> bytes:
    """A line never answered (expired, cancelled, its batch failed): the error file's `error` form."""
    return _encode(ResultLine(line_id, custom_id, None, LineError(code, message)))


def ts(value: float | None) -> int | None:
    return None if value is None else int(value)
