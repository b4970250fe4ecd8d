"""The key API (`/admin/keys`) and the ledger's usage report, behind an admin key.

The app passes in the admin check (gateway/edge/admin_role.py `identify`) and the error renderer. Bad input is
a 400 naming the field, and so is what the config refuses for a `keys:` entry (gateway/config/consistency.py
`key_problem`, against the `teams:`, aliases and providers in force); a name taken in the key's namespace
(gateway/ledger/namespaces.py) is a 409, as are a team's keys past `teams.<name>.max_keys` and a key's earlier
secrets past `MAX_GRACE_SECRETS` (gateway/ledger/keys.py); an unknown or revoked id a 404. A team's admin works
within its team: its new keys are its team's and no more than the team may (a 403 naming the field), and another
team's key id is a 404, as an unknown one, so ids cannot be probed. A new key's `models` may be wider than its team's
`models`: the team's apply to every key of it as it calls.
Docs: docs/ledger.md, docs/security.md#admin-roles.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping
from typing import Annotated, Any, Final

import msgspec
from litestar import Request, Response, delete, get, post
from litestar.handlers import HTTPRouteHandler
from msgspec import Meta

from gateway.config import BudgetUsd, FairWeight, LimitsConfig, Priority, TeamConfig, key_problem
from gateway.config.consistency import RANK
from gateway.edge.admin_role import AdminRole
from gateway.ledger import keys as keystore
from gateway.ledger.book import Ledger
from gateway.ledger.engine import LedgerDown
from gateway.ledger.namespaces import takes_yaml_name
from gateway.ledger.report import ReportError, report
from gateway.ledger.service import LedgerService
from gateway.limits.usage import ANONYMOUS
from gateway.path.dialects import decode_error
from wire.errors import GatewayError, InvalidRequestError, PermissionDeniedError, shown

JSON: Final = "application/json"
_NO_STORE: Final = {"cache-control": "no-store"}
_MAX_GRACE_S: Final = 30 * 86_400
_MAX_EXPIRES_S: Final = 100 * 365 * 86_400  # a century: a key meant to last longer is made without one
_LIMITED: Final = ("rps", "rpm", "tpm", "tpd", "concurrent")  # a key's `limits` a team admin is held to

# The admin check: the pipeline, and the caller's role or the refusal to send.
Identify = Callable[[Request[Any, Any, Any]], tuple[Any, AdminRole | Response[bytes]]]
Render = Callable[[GatewayError], Response[bytes]]


class NewKey(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    # `\Z`, not `$`: msgspec searches, and `$` also matches before a final newline ("alice\n" beside "alice").
    name: Annotated[str, Meta(pattern=r"\A[A-Za-z0-9._:@-]{1,64}\Z")]
    team: Annotated[str, Meta(pattern=r"\A[A-Za-z0-9._:@-]{1,64}\Z")] | None = None
    models: Annotated[list[Annotated[str, Meta(min_length=1, max_length=256)]], Meta(max_length=256)] = msgspec.field(
        default_factory=lambda: ["**"]
    )
    max_cost_per_day: BudgetUsd | None = None
    max_cost_per_month: BudgetUsd | None = None
    expires_in_s: Annotated[int, Meta(ge=1, le=_MAX_EXPIRES_S)] | None = None
    limits: LimitsConfig | None = None  # rps, rpm, tpm, tpd, concurrent, max_queue_ms: a YAML key's block
    batch_limits: LimitsConfig | None = None  # its batch lines', in place of `batches.limits`
    # The key's share of a saturated server, as a YAML key's (docs/fairness.md).
    weight: FairWeight = 1.0
    priority: Priority | None = None
    max_priority: Priority | None = None


class Rotation(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    grace_s: Annotated[int, Meta(ge=0, le=_MAX_GRACE_S)] = 3600


def _json(value: Any, status: int = 200) -> Response[bytes]:
    return Response(msgspec.json.encode(value), status_code=status, media_type=JSON, headers=_NO_STORE)


def _conflict(message: str) -> GatewayError:
    return GatewayError(message, status=409, type="invalid_request_error", param="name", code="key_exists")


def _no_key(key_id: str) -> GatewayError:
    # The same answer for another team's key as for none: a team admin cannot tell which ids exist.
    return GatewayError(f"No key {shown(key_id)!r}", status=404, code="not_found", type="not_found_error")


def beyond_team(spec: NewKey, team: str, teams: Mapping[str, TeamConfig]) -> tuple[str, str] | None:
    """What a team admin's new key asks for beyond its team, as (field, why): another team, a budget above the
    team's, a larger share of a saturated server (`weight`), a higher `max_priority`, a rate (`limits.<kind>`)
    above the team's, or any `batch_limits` (they stand in for the operator's `batches.limits`, which no team's
    limits bound)."""
    if spec.team != team:
        return "team", f"a team admin makes keys of its own team ({team!r}) only"
    if spec.batch_limits is not None:
        return "batch_limits", "a key's batch_limits replace batches.limits: only the operator's admin key sets them"
    own = teams.get(team)
    if own is None:  # the team left `teams:` (a reload, or a replica's YAML): its admin grants nothing
        return "team", f"no team {team!r} under teams:"
    for field, mine, most in (
        ("max_cost_per_day", spec.max_cost_per_day, own.max_cost_per_day),
        ("max_cost_per_month", spec.max_cost_per_month, own.max_cost_per_month),
        ("weight", spec.weight, own.weight),
    ):
        if most is not None and mine is not None and mine > most:
            return field, f"{mine:g} is above team {team!r}'s {field} {most:g}"
    ceiling = own.max_priority or "normal"
    if spec.max_priority is not None and RANK[spec.max_priority] > RANK[ceiling]:
        return "max_priority", f"{spec.max_priority!r} is above team {team!r}'s max_priority {ceiling!r}"
    return _above_limits(spec.limits, own.limits, team)


def _above_limits(mine: LimitsConfig | None, most: LimitsConfig | None, team: str) -> tuple[str, str] | None:
    """A key's own rate above its team's (which caps all of its keys together anyway): refused, so that what
    the key shows is what it can have. A rate the team leaves unset bounds nothing."""
    if mine is None or most is None:
        return None
    for kind in _LIMITED:
        asked, allowed = getattr(mine, kind), getattr(most, kind)
        if asked is not None and allowed is not None and asked > allowed:
            return f"limits.{kind}", f"{asked} is above team {team!r}'s limits.{kind} {allowed}"
    return None


def routes(identify: Identify, render: Render) -> list[HTTPRouteHandler]:
    """The ledger's admin routes, checked by the app's admin `identify` and rendered by its `render`."""

    def service(request: Request[Any, Any, Any]) -> LedgerService:
        svc: LedgerService = request.app.state.ledger
        return svc

    async def run(request: Request[Any, Any, Any], fn: Callable[..., Any], *args: Any) -> Any:
        return await service(request).ledger.change(lambda cur: fn(cur, *args))

    async def applied(svc: LedgerService) -> None:
        # The change is committed: its answer (a new secret, shown only this once) must not turn into an error
        # because reading the keys back did not answer; the poller applies it within `keys_poll_ms` of that.
        with contextlib.suppress(LedgerDown):
            await svc.poller.refresh()

    def unavailable(exc: LedgerDown) -> Response[bytes]:
        return render(unavailable_error(exc))

    @post("/admin/keys", status_code=201)
    async def create_key(request: Request[Any, Any, Any]) -> Response[bytes]:
        _, role = identify(request)
        if isinstance(role, Response):
            return role
        try:
            spec = msgspec.json.decode(await request.body(), type=NewKey)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            return render(decode_error(exc))
        svc = service(request)
        if role.team is not None:
            if spec.team is None:
                spec = msgspec.structs.replace(spec, team=role.team)
            if (beyond := beyond_team(spec, role.team, svc.teams)) is not None:
                field, why = beyond
                return render(PermissionDeniedError(f"Not allowed '{field}': {why}", param=field, code="beyond_team"))
        # What the config refuses for a `keys:` entry, by the same check, against the `teams:` in force.
        if (problem := key_problem(spec, svc.teams, svc.names)) is not None:
            field, why = problem
            return render(InvalidRequestError(f"Invalid value for '{field}': {why}", param=field, code="invalid_value"))
        if takes_yaml_name(spec.name, spec.team, svc.poller.yaml):  # of its namespace: nothing of another team's
            return render(_conflict(f"A key named {spec.name!r} is in the config"))
        if spec.name == ANONYMOUS:  # its rows would be read as the keyless requests' spend, and theirs as its own
            return render(_conflict(f"{ANONYMOUS!r} is the name the ledger books requests without a key under"))
        expires = round(time.time() + spec.expires_in_s, 3) if spec.expires_in_s else None
        # A team admin's team is under `teams:` (`beyond_team`); the operator is held to no count.
        most = None if role.team is None else svc.teams[role.team].max_keys
        try:
            issued = await run(
                request,
                keystore.create,
                spec.name,
                spec.team,
                spec.models,
                spec.max_cost_per_day,
                expires,
                spec.limits,
                spec.max_cost_per_month,
                (spec.weight, spec.priority, spec.max_priority),
                spec.batch_limits,
                most,
            )
        except keystore.KeyConflict as exc:
            return render(_conflict(str(exc)))
        except keystore.TooManyKeys as exc:
            return render(
                GatewayError(f"Too many keys: {exc}", status=409, code="too_many_keys", type="invalid_request_error")
            )
        except LedgerDown as exc:
            return unavailable(exc)
        await applied(svc)
        return _json(issued, 201)

    @get("/admin/keys")
    async def list_keys(request: Request[Any, Any, Any]) -> Response[bytes]:
        _, role = identify(request)
        if isinstance(role, Response):
            return role
        try:
            return _json({"keys": await run(request, keystore.listing, role.team)})
        except LedgerDown as exc:
            return unavailable(exc)

    @post("/admin/keys/{key_id:str}/rotate", status_code=200)
    async def rotate_key(request: Request[Any, Any, Any]) -> Response[bytes]:
        key_id = str(request.path_params["key_id"])
        _, role = identify(request)
        if isinstance(role, Response):
            return role
        body = await request.body()
        try:
            spec = msgspec.json.decode(body, type=Rotation) if body.strip() else Rotation()
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            return render(decode_error(exc))
        try:
            issued = await run(request, keystore.rotate, key_id, spec.grace_s, role.team)
        except keystore.KeyNotFound:
            return render(_no_key(key_id))
        except keystore.TooManySecrets as exc:
            message = f"Too many secrets: {exc}"
            kind = "invalid_request_error"
            return render(GatewayError(message, status=409, param="grace_s", code="too_many_secrets", type=kind))
        except LedgerDown as exc:
            return unavailable(exc)
        await applied(service(request))
        return _json(issued)

    @delete("/admin/keys/{key_id:str}", status_code=200)
    async def revoke_key(request: Request[Any, Any, Any]) -> Response[bytes]:
        key_id = str(request.path_params["key_id"])
        _, role = identify(request)
        if isinstance(role, Response):
            return role
        try:
            await run(request, keystore.revoke, key_id, role.team)
        except keystore.KeyNotFound:
            return render(_no_key(key_id))
        except LedgerDown as exc:
            return unavailable(exc)
        await applied(service(request))
        return _json({"id": key_id, "revoked": True})

    return [create_key, list_keys, rotate_key, revoke_key]


REPORT_PARAMS: Final = ("from", "to", "by", "format")
RETRY_AFTER_S: Final = 2  # a 503 `ledger_unavailable`'s Retry-After


async def usage_response(
    ledger: Ledger, params: Mapping[str, str], render: Render, team: str | None = None
) -> Response[bytes]:
    """`GET /admin/usage?from=&to=&by=&format=`: the ledger's report (gateway/edge/status.py hands it over);
    with a `team` (a team admin's), that team's rows alone."""
    try:
        p = params
        body, media = await report(ledger, p.get("from"), p.get("to"), p.get("by"), p.get("format"), team)
    except ReportError as exc:
        return render(InvalidRequestError(str(exc), param=exc.param, code="invalid_value"))
    except LedgerDown as exc:
        return render(unavailable_error(exc))
    return Response(body, media_type=media, headers=_NO_STORE)


def unavailable_error(exc: LedgerDown) -> GatewayError:
    """503 `ledger_unavailable`: the database did not answer (within `ledger.timeout_ms`); worth a retry soon."""
    return GatewayError(
        f"The ledger is unavailable: {exc}", status=503, code="ledger_unavailable", retry_after=RETRY_AFTER_S
    )
