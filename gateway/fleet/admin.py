"""`POST /admin/providers/{name}/replicas/{index}/drain` and `.../undrain`: take a replica out of (or back
into) rotation. A draining replica takes no new requests; those in flight and open streams finish.

The flag lives in this process (each worker and gateway process has its own: send the call to each, or
set `drain: true` on the replica in the config and reload). The routes are made by `drain_routes`, given
the admin check of the ops routes, so this wing imports nothing above it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from litestar import Request, Response, post
from litestar.handlers import HTTPRouteHandler

from gateway.fleet.picker import Fleet
from wire.errors import GatewayError, InvalidRequestError
from wire.schema import encode

# The admin check: the router's fleets, or the refusal to send (401, or 404 without an admin key).
Authorize = Callable[[Request[Any, Any, Any]], tuple[Mapping[str, Fleet], Response[bytes] | None]]
Render = Callable[[GatewayError], Response[bytes]]


def state(fleet: Fleet) -> list[dict[str, Any]]:
    """Each replica as the status page and the admin answers show it."""
    out: list[dict[str, Any]] = []
    for i in range(fleet.size):
        load = fleet.engine[i]
        engine = None if load is None else {"waiting": load.waiting, "running": load.running, "kv_usage": load.kv_usage}
        out.append(
            {
                "replica": fleet.names[i],
                "url": fleet.urls[i],
                "weight": fleet.weights[i],
                "draining": fleet.draining[i],
                "engine": engine,
            }
        )
    return out


def drain_routes(authorize: Authorize, render: Render) -> list[HTTPRouteHandler]:
    def set_drain(request: Request[Any, Any, Any], name: str, index: int, draining: bool) -> Response[bytes]:
        fleets, refused = authorize(request)
        if refused is not None:
            return refused
        fleet = fleets.get(name)
        if fleet is None:
            return render(
                GatewayError(f"No provider {name!r} with replicas", status=404, code="not_found", param="name")
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
        return Response(encode({"provider": name, "replicas": state(fleet)}), media_type="application/json")

    @post("/admin/providers/{name:str}/replicas/{index:int}/drain", status_code=200)
    async def drain(request: Request[Any, Any, Any]) -> Response[bytes]:
        return set_drain(request, request.path_params["name"], request.path_params["index"], True)

    @post("/admin/providers/{name:str}/replicas/{index:int}/undrain", status_code=200)
    async def undrain(request: Request[Any, Any, Any]) -> Response[bytes]:
        return set_drain(request, request.path_params["name"], request.path_params["index"], False)

    return [drain, undrain]
