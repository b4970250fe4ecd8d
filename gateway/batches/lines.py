"""An input file's validation, a line at a time: each valid line, or the errors that fail the batch, naming the line.

What fails the whole batch (as OpenAI does): a line that is not a JSON object of `custom_id`, `method`,
`url` and `body`; a `custom_id` missing or used twice; a `url` other than the batch's endpoint; more lines
than `batches.max_lines` or bytes than `batches.max_file_bytes` (each naming the first line over: a file
stored before a reload lowered the cap). What only fails its own line (the error file): anything the
request path refuses when the line runs (a bad field, an unknown model), a line asking to stream, which a
batch cannot, and a line longer than `caps.request_body_bytes`, unread (`gateway.batches.checking`), under
the custom_id either end of it shows (`gateway.batches.custom_ids`; without one, it fails the batch).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final

import msgspec

from gateway.batches.custom_ids import TAIL_BYTES, find_id
from gateway.batches.objects import BatchError
from wire.errors import shown

# OpenAI stops listing after this many; the batch fails on the first anyway.
MAX_ERRORS: Final = 100
# The longest model name the Batch object shows (a name this long is no route's: its line fails when it runs).
MODEL_CHARS: Final = 256


class _Line(msgspec.Struct):
    custom_id: Any = None
    method: Any = None
    url: Any = None
    body: msgspec.Raw = msgspec.Raw(b"")


class _Body(msgspec.Struct):
    stream: Any = None
    model: Any = None


_line = msgspec.json.Decoder(_Line).decode
_body = msgspec.json.Decoder(_Body).decode


class Refusal(msgspec.Struct, frozen=True):
    """A line answered at once with an error, unsent: its status and the error's code, field and message."""

    status: int
    code: str
    param: str | None
    message: str

    def body(self) -> bytes:
        error = {"message": self.message, "type": "invalid_request_error", "param": self.param, "code": self.code}
        return msgspec.json.encode({"error": error})


_STREAMS: Final = Refusal(
    400, "invalid_value", "stream", "A batch's lines cannot stream: remove `stream` from the body"
)


class Line(msgspec.Struct, frozen=True):
    """One valid line: its custom_id, its request body (bytes, as sent) and its refusal when it has one."""

    custom_id: str
    body: bytes
    refusal: Refusal | None = None
    model: str | None = None  # the model the body names, where it names one as a string


class Skipped(msgspec.Struct, frozen=True):
    """A line longer than `caps.request_body_bytes`, not held (`gateway.batches.checking`): its length, and
    its custom_id where either end of the line shows it (`gateway.batches.custom_ids`)."""

    size: int
    custom_id: str | None


def batch_model(lines: list[Line]) -> str | None:
    """The Batch object's `model`: the one model every line names; None where lines name different models
    (the gateway runs them, where OpenAI would take one model per file) or a line names none."""
    models = {line.model for line in lines}
    if len(models) != 1:
        return None
    return models.pop()


def up_front(size: int, over: int, count: int, max_lines: int, max_bytes: int) -> list[BatchError]:
    """The errors that fail a file of `size` bytes and `count` lines before any line is read (`over`: the line
    holding its byte `max_bytes + 1`, when it has one). Counted first: a list of every line would cost many
    times the file's size (a file of short lines, 15 times) before a file of too many is refused."""
    if size > max_bytes:  # stored under a larger `batches.max_file_bytes` (a reload lowered it since)
        message = f"The input file has {size} bytes; at most {max_bytes} (batches.max_file_bytes)"
        return [BatchError("file_too_large", message, None, over)]
    if not count:
        return [BatchError("empty_file", "The input file has no lines", None, None)]
    if count > max_lines:
        message = f"The input file has {count} lines; at most {max_lines} (batches.max_lines)"
        return [BatchError("too_many_lines", message, None, max_lines + 1)]  # the first line over
    return []


class Checker:
    """A file's lines checked one at a time, in order: each valid one returned, the errors that fail the
    batch kept (at most MAX_ERRORS, 1-based line numbers)."""

    def __init__(self, endpoint: str, max_line: int) -> None:
        self.endpoint = endpoint
        self.max_line = max_line  # `caps.request_body_bytes`: a line is one request's body, and more
        self.errors: list[BatchError] = []
        self.seen: set[str] = set()
        self.models: set[str | None] = set()

    def model(self) -> str | None:
        """`batch_model` of the lines returned so far."""
        return next(iter(self.models)) if len(self.models) == 1 else None

    def _fail(self, code: str, message: str, number: int | None, param: str | None = None) -> None:
        if len(self.errors) < MAX_ERRORS:
            self.errors.append(BatchError(code, message, param, number))

    def line(self, number: int, raw: bytes | Skipped) -> Line | None:
        """Line `number` (without its newline), or None when it is not valid (its error kept)."""
        if not isinstance(raw, Skipped) and len(raw) > self.max_line:
            raw = Skipped(len(raw), find_id(raw, self.max_line, raw[-TAIL_BYTES:]))
        if isinstance(raw, Skipped):
            return self._too_long(number, raw)
        fail = self._fail
        if not raw.strip():
            fail("invalid_json_line", "This line is empty: every line must be one JSON object", number)
            return None
        try:
            raw.decode()  # msgspec passes a string's bytes through unchecked; a line is stored as text
            line = _line(raw)
        except (msgspec.MsgspecError, UnicodeDecodeError, RecursionError):
            # RecursionError: nesting deeper than the decoder goes.
            fail("invalid_json_line", "This line is not valid UTF-8 JSON: every line must be one JSON object", number)
            return None
        cid = line.custom_id
        if not self._new_id(number, cid):
            return None
        if line.method != "POST":
            fail("invalid_method", "The method must be POST", number, "method")
            return None
        if line.url != self.endpoint:
            message = f"The url {shown(repr(line.url))} is not the batch's endpoint {self.endpoint!r}"
            fail("invalid_url", message, number, "url")
            return None
        body = bytes(line.body)
        if not body.lstrip().startswith(b"{"):
            fail("invalid_request", "The body must be a JSON object: a request to the endpoint", number, "body")
            return None
        try:
            fields = _body(body)
        except (msgspec.MsgspecError, RecursionError):
            fields = _Body()  # the request path refuses the body itself, naming the field
        wants_stream = fields.stream not in (None, False)
        refusal = _STREAMS if wants_stream else None
        model = fields.model
        if type(model) is not str or len(model) > MODEL_CHARS or "\x00" in model:
            model = None  # not a name the Batch object shows: the request path refuses it when the line runs
        self.models.add(model)
        return Line(cid, body, refusal, model)

    def _new_id(self, number: int, cid: Any) -> bool:
        """Whether `cid` is a custom_id line `number` may have (one no earlier line has), kept if so."""
        fail = self._fail
        if not isinstance(cid, str) or not cid:
            fail("missing_required_parameter", "This line has no custom_id (a non-empty string)", number, "custom_id")
            return False
        if "\x00" in cid:  # no text column (PostgreSQL's) holds it
            fail("invalid_value", "This line's custom_id holds a NUL character", number, "custom_id")
            return False
        if cid in self.seen:
            message = f"The custom_id {shown(repr(cid))} is used by an earlier line"
            fail("duplicate_custom_id", message, number, "custom_id")
            return False
        self.seen.add(cid)
        return True

    def _too_long(self, number: int, skipped: Skipped) -> Line | None:
        """A line over `max_line`, unread: refused in the error file under its custom_id, as a body over the
        cap is at the interactive route's door; without one found, it fails the batch."""
        over = f"This line has {skipped.size} bytes, more than the {self.max_line} caps.request_body_bytes allows"
        if skipped.custom_id is None:
            message = (
                f"{over} (line {number} of the input file), and has no custom_id (a string) where the gateway looks "
                "for one in a line it does not hold whole: among its fields before its first object or array value, "
                f"or after its last one within its last {TAIL_BYTES} bytes"
            )
            self._fail("line_too_large", message, number)
            return None
        if not self._new_id(number, skipped.custom_id):
            return None
        message = f"{over} for one request (line {number} of the input file): it was not read"
        self.models.add(None)  # whatever model it names is not known: the Batch object's is null
        return Line(skipped.custom_id, b"", Refusal(413, "request_too_large", None, message))


def _rows(data: bytes, count: int) -> Iterator[bytes]:
    """The file's first `count` lines, one at a time, without their newline."""
    start = 0
    for _ in range(count):
        end = data.find(b"\n", start)
        end = len(data) if end < 0 else end
        yield data[start:end]
        start = end + 1


def parse(
    data: bytes, endpoint: str, max_lines: int, max_bytes: int, max_line: int
) -> tuple[list[Line], list[BatchError]]:
    """A whole file's lines, or the errors that fail the batch (the runner checks a stored file as it reads
    it, `gateway.batches.checking`; this is the same check of a file in memory)."""
    over = data.count(b"\n", 0, max_bytes) + 1 if len(data) > max_bytes else 0
    ends = data.count(b"\n")
    count = ends + 1 if data[data.rfind(b"\n") + 1 :].strip() else ends  # blank after the last newline: none
    errors = up_front(len(data), over, count, max_lines, max_bytes)
    if errors:
        return [], errors
    checker = Checker(endpoint, max_line)
    checked = (checker.line(number, raw) for number, raw in enumerate(_rows(data, count), 1))
    lines = [line for line in checked if line is not None]
    return lines, checker.errors
