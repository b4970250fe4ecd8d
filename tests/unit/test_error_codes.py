"""Every `code` the gateway can put in an answer is snake_case, in `wire.errors.CODES`, and in docs/dialects.md.

The codes are read from the source (every `code="..."` literal, and the kinds the request decoder
passes positionally), so a new error with a new code fails here until it is listed and documented.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from wire.errors import CAUSES, CODES, upstream_failure

REPO = Path(__file__).resolve().parents[2]
SNAKE = re.compile(r"[a-z][a-z0-9]*(_[a-z0-9]+)*")
# Raised with the code as their last positional argument (gateway/path/dialects.py, wire/schema.py).
POSITIONAL = {"RequestError", "BodyError"}


def _codes_in_source() -> dict[str, str]:
    found: dict[str, str] = {}
    for path in sorted([*REPO.glob("gateway/**/*.py"), *REPO.glob("providers/*.py"), *REPO.glob("wire/*.py")]):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            # `code = "..."`: a code an error is given before it is built (wire.errors.UpstreamStatusError).
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
                if "code" in names and isinstance(node.value.value, str):
                    found[node.value.value] = f"{path.relative_to(REPO)}:{node.lineno}"
            if not isinstance(node, ast.Call):
                continue
            for kw in node.keywords:
                if kw.arg == "code" and isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, str):
                    found[kw.value.value] = f"{path.relative_to(REPO)}:{node.lineno}"
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
            if name in POSITIONAL and node.args:
                last = node.args[-1]
                if isinstance(last, ast.Constant) and isinstance(last.value, str):
                    found[last.value] = f"{path.relative_to(REPO)}:{node.lineno}"
    return found


def test_every_code_in_the_source_is_listed() -> None:
    found = _codes_in_source()
    assert len(found) > 20  # the scan sees the codes (a broken scan would pass vacuously)
    missing = {code: where for code, where in found.items() if code not in CODES}
    # Adapters' own codes for upstream failures they detect themselves are listed too, so none is exempt.
    assert missing == {}


def test_every_code_is_snake_case_and_documented() -> None:
    doc = (REPO / "docs" / "dialects.md").read_text()
    bad = [code for code in CODES if not SNAKE.fullmatch(code)]
    assert bad == []
    undocumented = [code for code in CODES if f"`{code}`" not in doc]
    assert undocumented == []


def test_every_transport_cause_builds_a_listed_code() -> None:
    for cause in CAUSES:
        err = upstream_failure(cause, "p", "p/m")
        assert err.code in CODES
        assert (err.cause, err.target, err.provider) == (cause, "p/m", "p")
        assert err.message.startswith("Upstream 'p/m' ")


def test_flags_are_set_when_an_error_is_built_and_evolve_copies() -> None:
    from wire.errors import UpstreamError, UpstreamStatusError

    err = UpstreamError("x", code="invalid_upstream_response", retryable=True, cools=False, target="p/m", provider="p")
    assert (err.retryable, err.cools, err.same_target, err.target, err.provider) == (True, False, False, "p/m", "p")
    # Class defaults stay class defaults: an error built without a flag does not store one.
    assert "retryable" not in vars(UpstreamError("y"))
    later = err.evolve(attempts=3, retry_later=True)
    assert (later.attempts, later.retry_later, later.message, later.code) == (3, True, "x", "invalid_upstream_response")
    assert type(later) is UpstreamError and later is not err
    assert (err.attempts, err.retry_later) == (None, False)  # the original is as it was built
    status = UpstreamStatusError("boom", upstream_status=503, provider="p")
    named = status.evolve(target="p/m")
    assert (named.upstream_status, named.cause, named.target, named.retryable) == (503, "http_503", "p/m", True)
    assert status.target is None


# Every GatewayError class (by name) whose instances reach clients: built anywhere without `code=`, an
# answer would carry `"code": null`.
_ERRORS = {
    "GatewayError",
    "InvalidRequestError",
    "AuthenticationError",
    "PermissionDeniedError",
    "ProviderUnavailableError",
    "RateLimitError",
    "UpstreamError",
    "UpstreamConnectError",
    "UpstreamUnreachableError",
    "UpstreamTimeoutError",
}


def test_every_error_is_built_with_a_code() -> None:
    codeless: list[str] = []
    for path in sorted([*REPO.glob("gateway/*.py"), *REPO.glob("providers/*.py"), *REPO.glob("wire/*.py")]):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if not isinstance(node, ast.Call):
                continue
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
            if name not in _ERRORS:
                continue
            code = next((kw.value for kw in node.keywords if kw.arg == "code"), None)
            if code is None or (isinstance(code, ast.Constant) and code.value is None):
                codeless.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert codeless == []


def test_an_upstream_code_reaches_clients_in_snake_case() -> None:
    from gateway.upstream.scrub import Scrubber
    from wire.errors import UpstreamStatusError

    scrubber = Scrubber(["sk_upstream_secret_0123456789"])

    def shown(code: str | None, message: str = "p error (500): boom") -> tuple[str | None, str]:
        err = scrubber.error(UpstreamStatusError(message, upstream_status=500, provider="p", code=code))
        return err.code, err.message

    assert shown("server_error") == ("server_error", "p error (500): boom")
    assert shown("RESOURCE_EXHAUSTED")[0] == "resource_exhausted"
    assert shown("ThrottlingException")[0] == "throttling_exception"
    # A number, free text or nothing: the cause names it, and the upstream's own code stays in the message.
    assert shown("4.2", "p error: boom") == ("upstream_http_500", "p error: boom (upstream code 4.2)")
    assert shown("500") == ("upstream_http_500", "p error (500): boom (upstream code 500)")
    assert shown("Internal Error!")[0] == "upstream_http_500"
    assert shown(None) == ("upstream_http_500", "p error (500): boom")
    assert shown("x" * 100)[0] == "upstream_http_500"
    # A code that quotes a secret is no code, and the secret is cut out of the message it moves to.
    code, message = shown("sk_upstream_secret_0123456789")
    assert code == "upstream_http_500" and "0123456789" not in message
