"""What each dialect's error looks like on the wire, for exact assertions, and the routes that speak each."""

from __future__ import annotations

from typing import Any, Final

import httpx

OPENAI_ROUTES: Final = ("/v1/completions", "/inference/v1/completions")
FASTAPI_ROUTES: Final = ("/v4/beta/completions", "/api/v1/compatibility/openai/v1/completions")
ALL_ROUTES: Final = OPENAI_ROUTES + FASTAPI_ROUTES
SGP_ROUTE: Final = "/v4/beta/completions"
PAIS_ROUTE: Final = "/api/v1/compatibility/openai/v1/completions"


def assert_error(
    resp: httpx.Response,
    route: str,
    *,
    status: int,
    type: str,
    message: str,
    param: str | None = None,
    code: str | None = None,
    loc: list[str | int] | None = None,
    field_error: bool | None = None,
    detail: str | None = None,
) -> None:
    """The route's dialect rendering of one gateway error, compared exactly.

    OpenAI routes: `{"error": {message, type, param, code}}` with `status`.
    SGP and PAIS (FastAPI services): a field error (by default: a 400 naming a field) becomes FastAPI's
    422 detail list with `loc = ["body", *path]`; anything else keeps its status with
    `{"detail": detail or message}`.
    """
    assert resp.headers["content-type"].startswith("application/json"), resp.headers
    body: Any = resp.json()
    if route in OPENAI_ROUTES:
        assert (resp.status_code, body) == (
            status,
            {"error": {"message": message, "type": type, "param": param, "code": code}},
        )
        return
    assert route in FASTAPI_ROUTES, route
    if field_error is None:
        field_error = status == 400 and param is not None
    if field_error:
        assert param is not None or loc is not None
        where: list[str | int] = loc if loc is not None else list((param or "").split("."))
        expected = {"detail": [{"loc": ["body", *where], "msg": message, "type": code or "value_error"}]}
        assert (resp.status_code, body) == (422, expected)
        return
    assert (resp.status_code, body) == (status, {"detail": detail or message})


def assert_field_error(resp: httpx.Response, route: str, param: str | None, status: int = 400) -> dict[str, Any]:
    """A 4xx in the route's dialect naming `param`: OpenAI's envelope, or FastAPI's 422 with `loc`."""
    assert resp.headers["content-type"].startswith("application/json"), (resp.status_code, resp.text)
    body: dict[str, Any] = resp.json()
    if route in OPENAI_ROUTES:
        assert resp.status_code == status, body
        assert body["error"]["param"] == param, body
        assert body["error"]["type"] == "invalid_request_error", body
    else:
        assert resp.status_code == (422 if status == 400 else status), body
        if status == 400:
            (item,) = body["detail"]
            assert item["loc"][:2] == (["body", param] if param else ["body"]), body
    return body
