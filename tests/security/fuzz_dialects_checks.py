"""The properties every answer of the dialect fuzzing must have: JSON in its dialect's shape, never a 5xx."""

from __future__ import annotations

import json
import re
from typing import Any, Final

from tests.security.fuzz_dialects_gateway import ROUTES, Gateway

# Properties


def _strict_json(text: str) -> Any:
    def refuse(literal: str) -> Any:
        raise ValueError(f"not JSON: {literal}")

    return json.loads(text, parse_constant=refuse)


def _error_shape(dialect: str, status: int, doc: Any) -> None:
    if dialect == "openai":
        assert isinstance(doc, dict) and set(doc) == {"error"}, f"not an OpenAI error envelope: {doc!r}"
        err = doc["error"]
        assert isinstance(err, dict) and set(err) == {"message", "type", "param", "code"}, err
        assert isinstance(err["message"], str) and isinstance(err["type"], str), err
        return
    assert isinstance(doc, dict) and set(doc) == {"detail"}, f"not a FastAPI error: {doc!r}"
    detail = doc["detail"]
    if isinstance(detail, list):
        assert status == 422, (status, detail)
        for item in detail:
            assert set(item) == {"loc", "msg", "type"} and item["loc"][0] == "body", item
    else:
        assert isinstance(detail, str), detail


def _completion_shape(doc: Any) -> None:
    assert isinstance(doc, dict) and doc.get("object") == "text_completion", doc
    assert isinstance(doc["id"], str) and isinstance(doc["model"], str) and isinstance(doc["choices"], list), doc
    for choice in doc["choices"]:
        assert isinstance(choice["text"], str) and isinstance(choice["index"], int), choice


_ASKED_FAILURE: Final = re.compile(r"^demo/error-5\d\d$")


def _model_of(body: bytes) -> str | None:
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    return doc.get("model") if isinstance(doc, dict) and isinstance(doc.get("model"), str) else None


def check(gateway: Gateway, route: str, body: bytes) -> None:
    dialect = ROUTES[route]
    resp = gateway.post(route, body)
    status = resp.status_code
    if status >= 500:
        # A failure the fake provider was asked for, or the cooldown it then earned its target.
        asked = status in (502, 503, 504) and _ASKED_FAILURE.match(_model_of(body) or "")
        assert asked, f"{status} from the gateway itself: {resp.text[:300]!r}"
    kind = resp.headers.get("content-type", "")
    if kind.startswith("text/event-stream"):
        assert status == 200, status
        events = [e for e in resp.text.split("\n\n") if e]
        assert events and events[-1] == "data: [DONE]", f"a stream that does not end with [DONE]: {events[-2:]!r}"
        for event in events[:-1]:
            assert event.startswith("data: "), event
            doc = _strict_json(event[len("data: ") :])
            if "error" in doc:
                _error_shape("openai", 200, doc)  # mid-stream errors are OpenAI's envelope in every dialect
            else:
                _completion_shape(doc)
        return
    assert kind.startswith("application/json"), f"{status} answered as {kind!r}: {resp.text[:200]!r}"
    doc = _strict_json(resp.text)
    if status == 200:
        _completion_shape(doc)
    else:
        assert 400 <= status < 600, status
        _error_shape(dialect, status, doc)
