"""Who calls an admin route: the operator (`admin.key`), over everything, or a team's admin
(`teams.<name>.admin_key`), over its own team's runtime keys, usage, status and batches only.

Every admin route asks `identify` (the key routes, the usage report, the status and the batch routes, which
narrow what a team admin sees) or `operator_only` (every other route: a team admin's key is a 403 there),
so a route that does not narrow by team is closed to team admins by default. The presented key is compared
with every admin key in constant time, all of them each time, so the timing says neither whether nor whose
key matched. With no admin key configured at all the admin surface answers 404. Roles:
docs/security.md#admin-roles.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any, Final

import msgspec
from litestar import Request, Response
from litestar.exceptions import NotFoundException

from gateway.config import LoadedConfig
from gateway.edge.endpoint import headers_of
from gateway.edge.render import error_response
from gateway.limits.auth import presented_key
from gateway.path.dialects import OPENAI
from gateway.path.pipeline import Pipeline
from wire.errors import AuthenticationError, GatewayError, PermissionDeniedError

_NO_STORE: Final = {"cache-control": "no-store"}


class AdminRole(msgspec.Struct, frozen=True):
    # None: the operator, over every team (and keys of none); a name: that team's admin, over it alone.
    team: str | None = None


OPERATOR: Final = AdminRole()


def render(exc: GatewayError) -> Response[bytes]:
    """An admin route's error answer: the OpenAI error shape, never stored by a cache."""
    return error_response(OPENAI, exc, extra=_NO_STORE)


def admin_keys(loaded: LoadedConfig) -> list[tuple[bytes, AdminRole]]:
    """The SHA-256 of each admin key in force with its role: `admin.key`, then each team's `admin_key` (a key
    whose `${VAR}` is unset is none)."""
    found: list[tuple[bytes, AdminRole]] = []
    cfg = loaded.config
    if cfg.admin.key and not loaded.missing_for("admin.key"):
        found.append((hashlib.sha256(cfg.admin.key.encode()).digest(), OPERATOR))
    for name, team in cfg.teams.items():
        if team.admin_key and not loaded.missing_for(f"teams.{name}.admin_key"):
            found.append((hashlib.sha256(team.admin_key.encode()).digest(), AdminRole(name)))
    return found


def _unauthorized(message: str, code: str) -> Response[bytes]:
    return render(AuthenticationError(message, code=code, headers={"www-authenticate": "Bearer"}))


def identify(request: Request[Any, Any, Any]) -> tuple[Pipeline, AdminRole | Response[bytes]]:
    """The pipeline and the caller's role, or the 401 to send (a missing or wrong key); 404 (raised, rendered
    like any unknown route) when no admin key is configured."""
    pipeline: Pipeline = request.app.state.pipeline
    held = admin_keys(pipeline.loaded)
    if not held:
        raise NotFoundException()
    presented = presented_key(headers_of(request.scope))
    if not presented:
        return (
            pipeline,
            _unauthorized(
                "Missing admin key: send 'Authorization: Bearer <admin key>' or 'x-api-key: <admin key>'",
                "missing_api_key",
            ),
        )
    digest = hashlib.sha256(presented.encode()).digest()
    role: AdminRole | None = None
    for expected, held_role in held:  # every one compared, whichever matched
        if hmac.compare_digest(digest, expected) and role is None:
            role = held_role
    if role is None:
        return pipeline, _unauthorized("Incorrect admin key provided", "invalid_api_key")
    return pipeline, role


def operator_only(request: Request[Any, Any, Any]) -> tuple[Pipeline, Response[bytes] | None]:
    """The pipeline, or the refusal to send: 401 as `identify`, 403 for a team admin's key."""
    pipeline, role = identify(request)
    if isinstance(role, Response):
        return pipeline, role
    refused = None
    if role.team is not None:
        refused = render(
            PermissionDeniedError(
                "This admin route is the operator's: a team's admin key manages its team's keys "
                "(/admin/keys) and batches (/admin/batches) and reads its team's usage (/admin/usage) "
                "and status (/admin/status) only",
                code="operator_only",
            )
        )
    return pipeline, refused


__all__ = ["OPERATOR", "AdminRole", "admin_keys", "identify", "operator_only", "render"]
