"""The OpenAI Files and Batches API (`/v1/files`, `/v1/batches`); the admins' batch routes are batch_admin.py.

Every route authenticates the client key as a completion request does and serves only what that key owns:
another key's id is a 404, never a 403 that would confirm it exists. Without `ledger:` every route answers
404 saying the Batch API needs one. Bad input is a 400 naming the field. Docs: docs/batches.md.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Final

import msgspec
from litestar import Request, Response, delete, get, post
from litestar.handlers import HTTPRouteHandler
from litestar.response import Stream

from gateway.batches import cancelling, files, store
from gateway.batches.incoming import Incoming
from gateway.batches.objects import (
    BatchError,
    BatchObject,
    BatchUsage,
    Deleted,
    ErrorList,
    FileObject,
    InputTokensDetails,
    OutputTokensDetails,
    Page,
    RequestCounts,
    ts,
)
from gateway.batches.send import ENDPOINTS
from gateway.batches.service import ANONYMOUS, Batches
from gateway.config.schema import TeamConfig
from gateway.edge.endpoint import headers_of
from gateway.edge.ledger_routes import unavailable_error
from gateway.edge.render import error_response
from gateway.edge.upload_form import BadForm, FileTooLarge, read_upload
from gateway.ledger.engine import LedgerDown
from gateway.limits.auth import KeyRing
from gateway.path.dialects import OPENAI, decode_error
from wire.errors import GatewayError, InvalidRequestError, shown

JSON: Final = "application/json"
_NO_STORE: Final = {"cache-control": "no-store"}
# fullmatch: `$` would let a trailing newline in; [0-9]: `\d` would let other scripts' digits in.
_WINDOW: Final = re.compile(r"([0-9]{1,6})([smh])")
_UNIT_S: Final = {"s": 1, "m": 60, "h": 3600}
_MAX_WINDOW_S: Final = 7 * 86_400
_CONTENT_LINES: Final = 1000  # result lines read per turn while a result file is sent, at most
_CONTENT_BYTES: Final = 4 * 1024 * 1024  # and bytes of them (or the one line, if longer)
_errors_list = msgspec.json.Decoder(list[BatchError]).decode


class ExpiresAfter(msgspec.Struct, forbid_unknown_fields=True):
    anchor: str
    seconds: int


class NewBatch(msgspec.Struct, forbid_unknown_fields=True):
    input_file_id: str
    endpoint: str
    completion_window: str
    metadata: dict[str, str] | None = None
    output_expires_after: ExpiresAfter | None = None


# OpenAI's bounds on a file's `expires_after`: an hour to 30 days after its creation, the one anchor.
_EXPIRES_MIN_S: Final = 3600
_EXPIRES_MAX_S: Final = 30 * 86_400


def _expiry(api: Batches, anchor: object, seconds: object, param: str) -> int | Response[bytes]:
    """An expiry's seconds after the file's creation, within `batches.retain_days`; a 400 naming the field when
    it is not OpenAI's."""
    if anchor != "created_at":
        return _bad(f"{param}.anchor must be 'created_at'", f"{param}.anchor")
    if isinstance(seconds, str) and seconds.isascii() and seconds.isdecimal() and len(seconds) <= 12:
        seconds = int(seconds)  # a form's field is text
    if type(seconds) is not int or not _EXPIRES_MIN_S <= seconds <= _EXPIRES_MAX_S:
        return _bad(
            f"{param}.seconds must be an integer from {_EXPIRES_MIN_S} (an hour) to {_EXPIRES_MAX_S} (30 days)",
            f"{param}.seconds",
        )
    return min(seconds, api.cfg.retain_days * 86_400)  # retention deletes every file older than that anyway


def json_answer(value: Any, status: int = 200) -> Response[bytes]:
    return Response(msgspec.json.encode(value), status_code=status, media_type=JSON, headers=_NO_STORE)


def _render(exc: GatewayError) -> Response[bytes]:
    return error_response(OPENAI, exc, extra=_NO_STORE)


def missing(what: str, ident: str) -> Response[bytes]:
    return _render(
        GatewayError(f"No {what} with id {shown(ident)!r}", status=404, code="not_found", type="not_found_error")
    )


def _bad(message: str, param: str | None) -> Response[bytes]:
    return _render(InvalidRequestError(message, param=param, code="invalid_value"))


def file_object(row: tuple[Any, ...]) -> FileObject:
    expires_at = None if row[8] is None else int(row[8])
    return FileObject(
        id=row[0], bytes=int(row[4]), created_at=int(row[5]), filename=row[2], purpose=row[3], expires_at=expires_at
    )


def batch_object(row: tuple[Any, ...]) -> BatchObject:
    errors = ErrorList(_errors_list(row[7])) if row[7] else None
    return BatchObject(
        id=row[0],
        endpoint=row[2],
        model=row[27],
        errors=errors,
        input_file_id=row[3],
        completion_window=row[4],
        status=row[5],
        output_file_id=row[21],
        error_file_id=row[22],
        created_at=int(row[9]),
        in_progress_at=ts(row[11]),
        expires_at=ts(row[10]),
        finalizing_at=ts(row[12]),
        completed_at=ts(row[13]),
        failed_at=ts(row[14]),
        expired_at=ts(row[15]),
        cancelling_at=ts(row[16]),
        cancelled_at=ts(row[17]),
        request_counts=RequestCounts(total=int(row[18]), completed=int(row[19]), failed=int(row[20])),
        metadata=msgspec.json.decode(row[6]) if row[6] else None,
        usage=BatchUsage(
            input_tokens=int(row[23]),
            input_tokens_details=InputTokensDetails(int(row[24])),
            output_tokens=int(row[25]),
            output_tokens_details=OutputTokensDetails(int(row[26])),
            total_tokens=int(row[23]) + int(row[25]),
        ),
    )


def _page(rows: list[tuple[Any, ...]], limit: int, shape: Callable[[tuple[Any, ...]], Any]) -> Page:
    data = [shape(r) for r in rows[:limit]]
    return Page(
        data=data,
        first_id=rows[0][0] if rows else None,
        last_id=rows[:limit][-1][0] if rows else None,
        has_more=len(rows) > limit,
    )


def _limit(request: Request[Any, Any, Any], most: int) -> int | Response[bytes]:
    raw = request.query_params.get("limit", "20")
    # "²" is a digit int() refuses, and so are more than 4,300 digits.
    if not (raw.isascii() and raw.isdigit() and len(raw) < 19) or not 1 <= int(raw) <= most:
        return _bad(f"limit must be a whole number from 1 to {most}", "limit")
    return int(raw)


_STATUS_BATCHES: Final = 50  # the status page lists at most this many running batches, oldest first


async def running_batches(api: Batches, keys: KeyRing, team: str | None = None) -> list[dict[str, Any]] | None:
    """The batches being run, with their progress, for the status page (None: the database did not answer);
    each owner by its key's label (`KeyRing.name_of`); with a `team` (a team admin's view), its team's keys' alone
    (`owners_of`), each by its name."""
    try:
        async with asyncio.timeout(api.store.wait_s):
            rows = await api.store.run(store.running, _STATUS_BATCHES, owners_of(keys, team))
    except (LedgerDown, TimeoutError):
        return None
    names = ("id", "owner", "status", "total", "completed", "failed", "created_at")
    return [{**dict(zip(names, r, strict=True)), "owner": keys.name_of(r[1], team), "owner_id": r[1]} for r in rows]


NEEDS_LEDGER: Final = GatewayError(
    "The Batch API needs a ledger: set `ledger.url` in the gateway's config (docs/batches.md)",
    status=404,
    code="batches_need_ledger",
    type="not_found_error",
)


def _who(request: Request[Any, Any, Any]) -> tuple[Batches, str] | Response[bytes]:
    """The Batch API and who asks (the calling key's identity), or the answer that refuses them."""
    api: Batches | None = request.app.state.batches
    if api is None:
        return _render(NEEDS_LEDGER)
    try:
        key = request.app.state.pipeline.keys.authenticate(headers_of(request.scope))
    except GatewayError as exc:
        return _render(exc)
    return api, key.ident if key is not None else ANONYMOUS


Work = Callable[[Request[Any, Any, Any], Batches, str], Awaitable[Response[Any]]]


def _serving(work: Work) -> Callable[[Request[Any, Any, Any]], Awaitable[Response[Any]]]:
    """A route: the caller authenticated, `work` run as them, a database that does not answer a 503."""

    async def handler(request: Request[Any, Any, Any]) -> Response[Any]:
        found = _who(request)
        if isinstance(found, Response):
            return found
        try:
            return await work(request, *found)
        except LedgerDown as exc:
            return _render(unavailable_error(exc))

    handler.__name__ = work.__name__.lstrip("_")
    return handler


async def _upload(request: Request[Any, Any, Any], api: Batches, owner: str) -> Response[Any]:
    content_type, options = request.content_type
    pipeline = request.app.state.pipeline
    caps = team_caps(pipeline.keys, pipeline.loaded.config.teams, owner)
    incoming = Incoming(api.store, owner, api.cfg.max_key_bytes, caps)
    try:
        answer = await _store_upload(request, api, incoming, content_type, options.get("boundary"))
    except files.UploadGone:
        message = f"The upload took longer than {int(files.UPLOAD_S)} s: send it again"
        answer = _render(InvalidRequestError(message, status=408, param="file", code="upload_timeout"))
    except BaseException:  # the client gone, the database down: nothing of it stays stored
        await incoming.abandon()
        raise
    if not isinstance(answer, tuple):
        await incoming.abandon()
        return answer
    return json_answer(file_object(answer))


async def _store_upload(
    request: Request[Any, Any, Any], api: Batches, incoming: Incoming, content_type: str, boundary: str | None
) -> tuple[Any, ...] | Response[Any]:
    """The upload stored as it arrives (`Incoming`), then made a file: its row, or the answer refusing it."""
    cfg = api.cfg
    try:
        if content_type != "multipart/form-data":
            raise BadForm("Send the file as multipart/form-data")
        form = await read_upload(boundary, request.stream(), cfg.max_file_bytes, incoming.write, files.CHUNK_BYTES)
    except BadForm as exc:
        return _bad(str(exc), exc.param)
    except files.TooManyBytes as exc:
        return _too_many_bytes(exc)
    except FileTooLarge:
        return _render(
            InvalidRequestError(
                f"The file is larger than {cfg.max_file_bytes} bytes (batches.max_file_bytes)",
                status=413,
                param="file",
                code="file_too_large",
            )
        )
    fields = form.fields
    if fields.get("purpose") != "batch":
        return _bad("purpose must be 'batch' (the gateway stores files for the Batch API only)", "purpose")
    if form.filename is None:
        return _bad("file is required: the JSONL input file, sent as multipart form data", "file")
    if "\x00" in form.filename:  # no text column (PostgreSQL's) holds one
        return _bad("The file's filename holds a NUL character", "file")
    # The `openai` SDK sends the object as two fields, `expires_after[anchor]` and `expires_after[seconds]`.
    anchor, seconds = fields.get("expires_after[anchor]"), fields.get("expires_after[seconds]")
    expires_s: int | None = None
    if anchor is not None or seconds is not None or "expires_after" in fields:
        expiry = _expiry(api, anchor, seconds, "expires_after")
        if isinstance(expiry, Response):
            return expiry
        expires_s = expiry
    name = (form.filename or "input.jsonl")[:256]
    try:
        return await incoming.finish(name, form.size, cfg.max_files, expires_s, cfg.max_key_bytes)
    except files.TooManyFiles as exc:
        return _render(
            GatewayError(f"Too many files: {exc}", status=409, code="too_many_files", type="invalid_request_error")
        )
    except files.TooManyBytes as exc:
        return _too_many_bytes(exc)


def _too_many_bytes(exc: files.TooManyBytes) -> Response[Any]:
    return _render(InvalidRequestError(f"Too many bytes: {exc}", status=409, param="file", code="too_many_bytes"))


async def _list_files(request: Request[Any, Any, Any], api: Batches, owner: str) -> Response[Any]:
    limit = _limit(request, 10_000)
    if isinstance(limit, Response):
        return limit
    purpose = request.query_params.get("purpose")
    if purpose and "\x00" in purpose:  # no text column (PostgreSQL's) holds one
        return _bad("purpose holds a NUL character", "purpose")
    now = time.time()
    extra = (f"purpose = ? AND {files.UNEXPIRED}", (purpose, now)) if purpose else (files.UNEXPIRED, (now,))
    after = request.query_params.get("after")
    order = request.query_params.get("order", "desc")
    if order not in ("asc", "desc"):
        return _bad("order must be 'asc' or 'desc'", "order")
    args = (owner, after, limit, extra, order == "asc")
    rows = await api.store.run(store.page, "batch_files", files.FILE_COLUMNS, *args)
    return json_answer(_page(rows, limit, file_object))


async def _one_file(request: Request[Any, Any, Any], api: Batches, owner: str) -> tuple[Any, ...] | Response[Any]:
    file_id = str(request.path_params["file_id"])
    row = await api.store.run(files.file_row, file_id, owner)
    return missing("file", file_id) if row is None else row


async def _get_file(request: Request[Any, Any, Any], api: Batches, owner: str) -> Response[Any]:
    row = await _one_file(request, api, owner)
    return row if isinstance(row, Response) else json_answer(file_object(row))


async def _file_content(request: Request[Any, Any, Any], api: Batches, owner: str) -> Response[Any]:
    row = await _one_file(request, api, owner)
    if isinstance(row, Response):
        return row
    if row[7] == "input":
        file_id = row[0]

        async def chunks() -> AsyncIterator[bytes]:
            seq = 0
            while (chunk := await api.store.run(files.input_chunk, file_id, seq)) is not None:
                yield chunk
                seq += 1

        # The length declared: a download the file's deletion cuts short ends as a broken one, not a whole one.
        sized = {**_NO_STORE, "content-length": str(int(row[4]))}
        return Stream(chunks(), media_type="application/octet-stream", headers=sized)
    batch_id, line_state = row[6], row[7]

    async def lines() -> AsyncIterator[bytes]:
        after = -1
        while True:
            chunk = await api.store.run(store.result_chunk, batch_id, line_state, after, _CONTENT_LINES, _CONTENT_BYTES)
            if not chunk:
                return
            after = chunk[-1][0]
            yield "".join(f"{text}\n" for _, text in chunk).encode()

    return Stream(lines(), media_type="application/octet-stream", headers=_NO_STORE)


async def _delete_file(request: Request[Any, Any, Any], api: Batches, owner: str) -> Response[Any]:
    file_id = str(request.path_params["file_id"])
    gone = await api.store.run(files.delete_file, file_id, owner)
    return json_answer(Deleted(file_id, True)) if gone else missing("file", file_id)


async def _create_batch(request: Request[Any, Any, Any], api: Batches, owner: str) -> Response[Any]:
    try:
        spec = msgspec.json.decode(await request.body(), type=NewBatch)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        return _render(decode_error(exc))
    if spec.endpoint not in ENDPOINTS:
        return _bad(f"endpoint must be one of {', '.join(map(repr, ENDPOINTS))}", "endpoint")
    window = _WINDOW.fullmatch(spec.completion_window)
    window_s = int(window.group(1)) * _UNIT_S[window.group(2)] if window else 0
    if not 1 <= window_s <= _MAX_WINDOW_S:
        return _bad(
            "completion_window must be '24h' (or another '<N>h', '<N>m', '<N>s' up to 7 days)", "completion_window"
        )
    if spec.metadata is not None and (
        len(spec.metadata) > 16 or any(len(k) > 64 or len(v) > 512 for k, v in spec.metadata.items())
    ):
        return _bad("metadata holds at most 16 pairs, keys of 64 characters, values of 512", "metadata")
    output_expires_s = None
    if spec.output_expires_after is not None:
        wanted = spec.output_expires_after
        output_expires_s = _expiry(api, wanted.anchor, wanted.seconds, "output_expires_after")
        if isinstance(output_expires_s, Response):
            return output_expires_s
    row = await api.store.run(files.file_row, spec.input_file_id, owner)
    if row is None or row[7] != "input":
        return missing("file", spec.input_file_id)
    window_spec = (spec.completion_window, window_s)
    try:
        batch_id = await api.store.run(
            store.add_batch,
            owner,
            spec.input_file_id,
            spec.endpoint,
            *window_spec,
            spec.metadata,
            api.cfg.max_batches,
            output_expires_s,
        )
    except store.TooManyBatches as exc:
        return _render(
            GatewayError(f"Too many batches: {exc}", status=409, code="too_many_batches", type="invalid_request_error")
        )
    made = await api.store.run(store.batch_row, batch_id, owner)
    api.runner.poke()
    return json_answer(batch_object(made)) if made is not None else missing("batch", batch_id)


async def _get_batch(request: Request[Any, Any, Any], api: Batches, owner: str) -> Response[Any]:
    batch_id = str(request.path_params["batch_id"])
    row = await api.store.run(store.batch_row, batch_id, owner)
    return missing("batch", batch_id) if row is None else json_answer(batch_object(row))


async def cancel(
    api: Batches, batch_id: str, owner: str | None, owners: store.Owners = store.EVERY_OWNER
) -> tuple[Any, ...] | None:
    """Cancel the batch, for its key or (`owner` None) an admin over the keys `owners` picks, and wake the
    runner to end it: the batch as it is then, None when the caller has no such batch."""
    row = await api.store.run(cancelling.cancel, batch_id, owner, owners)
    if row is not None:
        api.runner.poke()
    return row


async def _cancel_batch(request: Request[Any, Any, Any], api: Batches, owner: str) -> Response[Any]:
    batch_id = str(request.path_params["batch_id"])
    row = await cancel(api, batch_id, owner)
    return missing("batch", batch_id) if row is None else json_answer(batch_object(row))


def owners_of(keys: KeyRing, team: str | None) -> store.Owners:
    """Whose batches an admin reaches: its team's keys' (a team's admin), or every key's (`team` None)."""
    return store.team_owners(team, keys.yaml_idents(team)) if team is not None else store.EVERY_OWNER


def team_caps(keys: KeyRing, teams: Mapping[str, TeamConfig], owner: str) -> files.TeamCaps | None:
    """The caps on the files of the team of the key whose identity is `owner` (None: a key of no team)."""
    key = keys.identified(owner)
    if key is None or key.team is None or (team := teams.get(key.team)) is None:
        return None
    return files.TeamCaps(key.team, owners_of(keys, key.team), team.max_batch_bytes, team.max_batch_files)


def owned(keys: KeyRing, row: tuple[Any, ...], team: str | None = None) -> dict[str, Any]:
    """The Batch object as an admin sees it: with its key (`owner`: its label to the operator, its name to its
    `team`'s admin, `KeyRing.name_of`) and the key's identity (`owner_id`)."""
    owner = keys.name_of(row[1], team)
    return {**msgspec.structs.asdict(batch_object(row)), "owner": owner, "owner_id": row[1]}


async def listing(
    request: Request[Any, Any, Any], api: Batches, owner: str | None, team: str | None = None
) -> Response[Any]:
    """Batches newest first: the caller's own, or (`owner` None: an admin) every key's (the operator) or its
    team's keys' (`team`: a team's admin), each with its owner."""
    limit = _limit(request, 100)
    if isinstance(limit, Response):
        return limit
    after = request.query_params.get("after")
    keys: KeyRing = request.app.state.pipeline.keys
    # In the same statement as the read: a team admin's page, and its `after` cursor, never see another's rows.
    args = (owner, after, limit, ("", ()), False, owners_of(keys, team))
    rows = await api.store.run(store.page, "batches", store.BATCH_COLUMNS, *args)
    if owner is not None:
        return json_answer(_page(rows, limit, batch_object))
    return json_answer(_page(rows, limit, lambda r: owned(keys, r, team)))


def routes() -> list[HTTPRouteHandler]:
    """The routes; each finds the Batch API in the app's state (None: no ledger, a 404 saying so)."""
    return [
        post("/v1/files", status_code=200)(_serving(_upload)),
        get("/v1/files")(_serving(_list_files)),
        get("/v1/files/{file_id:str}")(_serving(_get_file)),
        get("/v1/files/{file_id:str}/content")(_serving(_file_content)),
        delete("/v1/files/{file_id:str}", status_code=200)(_serving(_delete_file)),
        post("/v1/batches", status_code=200)(_serving(_create_batch)),
        get("/v1/batches")(_serving(listing)),
        get("/v1/batches/{batch_id:str}")(_serving(_get_batch)),
        post("/v1/batches/{batch_id:str}/cancel", status_code=200)(_serving(_cancel_batch)),
    ]
