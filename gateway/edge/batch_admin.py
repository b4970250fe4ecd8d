"""The admins' batch routes: `/admin/batches` lists batches, `/admin/batches/{id}` reads one, `.../cancel`
cancels it, for whoever holds an admin key and not the batch's client key.

The operator (`admin.key`) reaches every key's batches; a team's admin (`teams.<name>.admin_key`) its team's
keys' alone, by the condition the listing uses, in the statement that reads the batch: another team's batch
is a 404 worded as an unknown id's. Each batch carries its owner (`owner`, `owner_id`), and a cancel is the
Batch API's own (batch_routes.py `cancel`). Roles: docs/security.md#admin-roles.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from litestar import Request, Response, get, post
from litestar.handlers import HTTPRouteHandler

from gateway.batches import store
from gateway.batches.service import Batches
from gateway.edge.admin_role import AdminRole, render
from gateway.edge.batch_routes import NEEDS_LEDGER, cancel, json_answer, listing, missing, owned, owners_of
from gateway.edge.ledger_routes import unavailable_error
from gateway.ledger.engine import LedgerDown
from gateway.limits.auth import KeyRing

# The admin check: the pipeline, and the caller's role or the refusal to send.
Identify = Callable[[Request[Any, Any, Any]], tuple[Any, AdminRole | Response[bytes]]]
Work = Callable[[Request[Any, Any, Any], Batches, AdminRole], Awaitable[Response[Any]]]


async def _listed(request: Request[Any, Any, Any], api: Batches, role: AdminRole) -> Response[Any]:
    return await listing(request, api, None, role.team)


async def _one(request: Request[Any, Any, Any], api: Batches, role: AdminRole) -> Response[Any]:
    batch_id = str(request.path_params["batch_id"])
    keys: KeyRing = request.app.state.pipeline.keys
    row = await api.store.run(store.batch_row, batch_id, None, owners_of(keys, role.team))
    return missing("batch", batch_id) if row is None else json_answer(owned(keys, row, role.team))


async def _cancel(request: Request[Any, Any, Any], api: Batches, role: AdminRole) -> Response[Any]:
    batch_id = str(request.path_params["batch_id"])
    keys: KeyRing = request.app.state.pipeline.keys
    row = await cancel(api, batch_id, None, owners_of(keys, role.team))
    return missing("batch", batch_id) if row is None else json_answer(owned(keys, row, role.team))


def routes(identify: Identify) -> list[HTTPRouteHandler]:
    """The routes, behind `identify` (gateway/edge/admin_role.py): a missing or wrong admin key is a 401, then
    no ledger is the Batch API's 404 saying it needs one, and a database that does not answer a 503."""

    def admin(work: Work) -> Callable[[Request[Any, Any, Any]], Awaitable[Response[Any]]]:
        async def handler(request: Request[Any, Any, Any]) -> Response[Any]:
            _, role = identify(request)
            if isinstance(role, Response):
                return role
            api: Batches | None = request.app.state.batches
            if api is None:
                return render(NEEDS_LEDGER)
            try:
                return await work(request, api, role)
            except LedgerDown as exc:
                return render(unavailable_error(exc))

        return handler

    listed, one, cancelled = admin(_listed), admin(_one), admin(_cancel)

    # Declared as decorators: the tests that classify every admin route by role read them from the source.
    @get("/admin/batches")
    async def admin_batches(request: Request[Any, Any, Any]) -> Response[Any]:
        return await listed(request)

    @get("/admin/batches/{batch_id:str}")
    async def admin_batch(request: Request[Any, Any, Any]) -> Response[Any]:
        return await one(request)

    @post("/admin/batches/{batch_id:str}/cancel", status_code=200)
    async def admin_cancel_batch(request: Request[Any, Any, Any]) -> Response[Any]:
        return await cancelled(request)

    return [admin_batches, admin_batch, admin_cancel_batch]
