"""No `asyncio.wait_for` in the gateway: `asyncio.timeout` bounds a wait instead.

On Python 3.11, `wait_for` returns the awaited answer when its task is cancelled in the step that answer
arrives, and the cancellation is lost: a background loop stopped by cancelling it runs on and shutdown waits
for it, and a request whose client went away goes on. `asyncio.timeout` keeps the cancellation (and runs a
coroutine in place instead of wrapping it in a task of its own). tests/ledger/test_cancelled_calls.py makes
the race happen.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def wait_fors(source: str) -> list[int]:
    """The lines that call `asyncio.wait_for` or import it."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Attribute)
            and node.attr == "wait_for"
            and isinstance(node.value, ast.Name)
            and node.value.id == "asyncio"
        ):
            lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module == "asyncio":
            lines += [node.lineno for alias in node.names if alias.name == "wait_for"]
    return lines


def test_the_check_sees_wait_for() -> None:
    assert wait_fors("import asyncio\nasync def f(x):\n    await asyncio.wait_for(x, 1)\n") == [3]
    assert wait_fors("from asyncio import wait_for\n") == [1]
    assert wait_fors("async def f(x):\n    async with asyncio.timeout(1):\n        await x\n") == []


def test_no_wait_for_in_the_gateway() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{line}"
        for package in ("gateway", "providers", "wire")
        for path in sorted((ROOT / package).rglob("*.py"))
        for line in wait_fors(path.read_text())
    ]
    assert not found, found
