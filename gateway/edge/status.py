"""Admin endpoints (`/admin/usage`, `/admin/status`, `DELETE /admin/cache`) and the status page (`GET /`).

The admin routes need the operator's admin key (gateway/edge/admin_role.py), but `/admin/usage` and
`/admin/status`, which a team's admin key reads narrowed to its team (the status page shows what they give
it); with no admin key configured they and the page answer 404, so the admin surface is never open. Routes
and auth: docs/operations.md, docs/security.md#admin-roles.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import re
from collections.abc import Mapping
from importlib import resources
from typing import Any, Final

from litestar import Request, Response, delete, get
from litestar.exceptions import NotFoundException

from gateway.batches.service import Batches
from gateway.edge.admin_role import admin_keys, identify, operator_only, render
from gateway.edge.batch_routes import running_batches
from gateway.edge.discovery import Discovery
from gateway.edge.drain import drain_routes
from gateway.edge.ledger_routes import REPORT_PARAMS, unavailable_error, usage_response
from gateway.edge.status_view import status, team_day
from gateway.edge.team_status import team_status
from gateway.fleet.picker import Fleet
from gateway.ledger.engine import LedgerDown
from gateway.ledger.report import day_usage
from gateway.path.pipeline import Pipeline
from gateway.state import SharedState
from wire.errors import GatewayError, InvalidRequestError, shown
from wire.schema import encode

JSON: Final = "application/json"
_NO_STORE: Final = {"cache-control": "no-store"}
_DAY: Final = re.compile(r"^\d{4}-\d{2}-\d{2}$")


def _error(exc: GatewayError) -> Response[bytes]:
    return render(exc)


def _require_admin_key(pipeline: Pipeline) -> None:
    """404 unless an admin key, the operator's or a team's, is configured (and its variable set)."""
    if not admin_keys(pipeline.loaded):
        raise NotFoundException()  # rendered like any unknown route


def _authorize(request: Request[Any, Any, Any]) -> tuple[Pipeline, Response[bytes] | None]:
    """The pipeline, and the refusal when the caller is not the operator (gateway/edge/admin_role.py)."""
    return operator_only(request)


@get("/admin/usage")
async def admin_usage(request: Request[Any, Any, Any]) -> Response[bytes]:
    pipeline, role = identify(request)
    if isinstance(role, Response):
        return role
    team = role.team  # a team admin sees its team's rows only
    ledger = pipeline.ledger
    if ledger is not None and any(p in request.query_params for p in REPORT_PARAMS):
        return await usage_response(ledger, request.query_params, _error, team)  # any range, from the ledger
    day = request.query_params.get("day") or pipeline.usage.today()
    try:
        if not _DAY.match(day):
            raise ValueError
        dt.date.fromisoformat(day)
    except ValueError:
        return _error(
            InvalidRequestError(
                f"Invalid day {shown(day)!r}: expected YYYY-MM-DD (UTC)", param="day", code="invalid_value"
            )
        )
    if ledger is not None:  # with a ledger every view of usage is the ledger's
        try:
            books = await day_usage(ledger, day, pipeline.keys.roster(team), team)
        except LedgerDown as exc:
            return _error(unavailable_error(exc))
        return Response(encode(books), media_type=JSON, headers=_NO_STORE)
    usage = await pipeline.usage.report(day)
    if team is not None:  # without a ledger usage is by key name: the names of the team's keys in force
        usage = team_day(usage, pipeline.keys.roster(team))
    return Response(encode(usage), media_type=JSON, headers=_NO_STORE)


@get("/admin/status")
async def admin_status(request: Request[Any, Any, Any]) -> Response[bytes]:
    pipeline, role = identify(request)
    if isinstance(role, Response):
        return role
    discovery: Discovery = request.app.state.discovery
    batches: Batches | None = request.app.state.batches
    if role.team is not None:  # a team's admin: its team's view (gateway/edge/team_status.py)
        body = await team_status(pipeline, role.team, batches, discovery.unreachable)
    else:
        body = await status(pipeline, discovery.unreachable)
        if batches is not None:
            body["batches"] = await running_batches(batches, pipeline.keys)
    return Response(encode(body), media_type=JSON, headers=_NO_STORE)


@delete("/admin/cache", status_code=200)
async def admin_cache_clear(request: Request[Any, Any, Any]) -> Response[bytes]:
    """Every cached answer, or with `?model=` those of one model (as clients name it), deleted."""
    pipeline, refused = _authorize(request)
    if refused is not None:
        return refused
    model = request.query_params.get("model") or None
    deleted = await pipeline.cache.clear(model) if pipeline.cache is not None else 0
    return Response(encode({"deleted": deleted, "model": model}), media_type=JSON, headers=_NO_STORE)


def _csp_hash(page: str, tag: str) -> str:
    start = page.find(f"<{tag}>")
    end = page.find(f"</{tag}>", start)
    if start < 0 or end < 0:
        raise RuntimeError(f"gateway/static/status.html has no <{tag}>")
    body = page[start + len(tag) + 2 : end]
    return "'sha256-" + base64.b64encode(hashlib.sha256(body.encode()).digest()).decode() + "'"


def _load_page() -> tuple[bytes, dict[str, str]]:
    page = resources.files("gateway").joinpath("static/status.html").read_text(encoding="utf-8")
    # Only this page's own inline script and style may run, and it may only talk to this origin.
    csp = (
        f"default-src 'none'; script-src {_csp_hash(page, 'script')}; style-src {_csp_hash(page, 'style')}; "
        "connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    )
    headers = {
        "content-security-policy": csp,
        "x-content-type-options": "nosniff",
        "referrer-policy": "no-referrer",
        "cache-control": "no-store",
    }
    return page.encode(), headers


# Read at import: a wheel built without the page fails to import this module (tests/ops/test_packaging.py).
_PAGE, _PAGE_HEADERS = _load_page()


@get("/")
async def status_page(request: Request[Any, Any, Any]) -> Response[bytes]:
    # The page itself holds no data (it asks for the key, then polls /admin/status), but without an admin
    # key it could never show any: the whole admin surface answers 404 then.
    _require_admin_key(request.app.state.pipeline)
    return Response(_PAGE, media_type="text/html", headers=_PAGE_HEADERS)


def _fleets(request: Request[Any, Any, Any]) -> tuple[Mapping[str, Fleet], SharedState, Response[bytes] | None]:
    pipeline, refused = _authorize(request)
    return pipeline.router.fleets, pipeline.shared, refused


ROUTES: Final = [admin_usage, admin_status, admin_cache_clear, status_page, *drain_routes(_fleets, _error)]

__all__ = ["ROUTES"]
