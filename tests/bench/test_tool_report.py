"""A bench tool's report: the command and time it opens with, and where it goes (--out or stdout)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench.tool_report import emit, invoked


def test_the_opening_names_the_command_and_the_time() -> None:
    line = invoked("redisload", ["--seconds", "3"])
    assert re.fullmatch(r"`python -m bench\.redisload --seconds 3` on \d{4}-\d\d-\d\d \d\d:\d\d UTC", line), line


def test_a_report_goes_to_out_and_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.md"
    emit("| a |\n", out, "cpusplit")
    assert out.read_text() == "| a |\n"
    captured = capsys.readouterr()
    assert captured.out == "" and f"[cpusplit] wrote {out}" in captured.err


def test_without_out_a_report_goes_to_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    emit("| a |\n", None, "profile")
    assert capsys.readouterr().out == "| a |\n\n"
