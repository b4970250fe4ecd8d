"""docs/testing.md says how many tests each missing program skips: the counts are the suite's own.

Each `path` (N tests) or `path` (N) in the page's table of needs is checked against pytest's collection of
that path, run as a child (collection only: nothing is started or built).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _collected(paths: list[str]) -> dict[str, int]:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *paths],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    counts = dict.fromkeys(paths, 0)
    for line in done.stdout.splitlines():
        for path in paths:
            if line.startswith(path.rstrip("/")):
                counts[path] += 1
    return counts


def test_the_skip_counts_in_testing_md_are_the_collected_counts() -> None:
    page = (ROOT / "docs" / "testing.md").read_text()
    table = page.split("## What the suite needs", 1)[1].split("\n## ", 1)[0]
    claims = {path: int(n) for path, n in re.findall(r"`(tests/[\w/.]+)` \((\d+)(?: tests?)?\)", table)}
    assert "tests/realservers/" in claims, claims
    assert _collected(list(claims)) == claims
    # The same count where the page explains the real-server suite.
    assert f"all {claims['tests/realservers/']} tests of\n`tests/realservers/`" in page
