"""`POST /admin/providers/{name}/replicas/{index}/drain` and `.../undrain`: take a replica out of (or back
into) rotation. A draining replica takes no new requests; those in flight and open streams finish.

With Redis the flag reaches every gateway process within a second (gateway/fleet/shared.py); without it,
it lives in the process that received the call. The routes are made by `drain_routes`, given the admin
check and the error rendering of the status routes (gateway/edge/status.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from litestar import Request, Response, post
from litestar.handlers import HTTPRouteHandler

from gateway.fleet.picker import Fleet
from gateway.fleet.shared import publish
from gateway.state import SharedState
from wire.errors import GatewayError, InvalidRequestError, shown
from wire.schema import encode

# The admin check: the router's fleets and the shared state, or the refusal to send (401, or 404 without
# an admin key).
Authorize = Callable[[Request[Any, Any, Any]], tuple[Mapping[str, Fleet], SharedState, Response[bytes] | None]]
Render = Callable[[GatewayError], Response[bytes]]


def state(fleet: Fleet) -> list[dict[str, Any]]:
    """Each replica as the status page and the admin answers show it."""
    out: list[dict[str, Any]] = []
    for i in range(fleet.size):
        load = fleet.load_of(i)
        engine = None if load is None else {"waiting": load.waiting, "running": load.running, "kv_usage": load.kv_usage}
        out.append(
            {
                "replica": fleet.names[i],
                "url": fleet.urls[i],
                "weight": fleet.weights[i],
                "draining": fleet.draining[i],
                "engine": engine,
                "engine_error": fleet.engine_error[i],
            }
        )
    return out


def drain_routes(authorize: Authorize, render: Render) -> list[HTTPRouteHandler]:
    async def set_drain(request: Request[Any, Any, Any], name: str, index: int, draining: bool) -> Response[bytes]:
        fleets, shared, refused = authorize(request)
        if refused is not None:
            return refused
        fleet = fleets.get(name)
        if fleet is None:
            return render(
                GatewayError(
                    f"No provider {shown(name)!r} with replicas",
                    status=404,
                    code="not_found",
                    type="not_found_error",
                    param="name",
                )
            )
        if not 0 <= index < fleet.size:
            return render(
                InvalidRequestError(
                    f"Provider {name!r} has replicas 0 to {fleet.size - 1}, not {index}",
                    param="index",
                    code="invalid_value",
                )
            )
        fleet.draining[index] = draining
        # With Redis every gateway process applies it within a second (gateway/fleet/shared.py).
        everywhere = await publish(shared, fleet, index, draining)
        answer = {"provider": name, "shared": everywhere, "replicas": state(fleet)}
        return Response(encode(answer), media_type="application/json")

    @post("/admin/providers/{name:str}/replicas/{index:int}/drain", status_code=200)
    async def drain(request: Request[Any, Any, Any]) -> Response[bytes]:
        return await set_drain(request, request.path_params["name"], request.path_params["index"], True)

    @post("/admin/providers/{name:str}/replicas/{index:int}/undrain", status_code=200)
    async def undrain(request: Request[Any, Any, Any]) -> Response[bytes]:
        return await set_drain(request, request.path_params["name"], request.path_params["index"], False)

    return [drain, undrain]
