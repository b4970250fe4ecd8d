"""Every link between README.md and docs/*.md leads somewhere: the file exists and, for `page.md#anchor`,
the page has a heading whose GitHub anchor that is. A heading renamed without its links fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_LINK = re.compile(r"\]\(([^)\s]+?\.md)?(?:#([^)\s]+))?\)")
_FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, each space a hyphen."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = _FENCE.sub("", page.read_text())
    return {anchor(h) for h in re.findall(r"^#{1,6} (.+)$", text, re.M)}


def test_every_link_between_the_pages_resolves() -> None:
    broken = []
    checked = 0
    for page in PAGES:
        for target, fragment in _LINK.findall(_FENCE.sub("", page.read_text())):
            if target.startswith(("http:", "https:")) or (not target and not fragment):
                continue
            dest = (page.parent / target).resolve() if target else page
            checked += 1
            if not dest.exists():
                broken.append(f"{page.name}: {target} does not exist")
            elif fragment and fragment not in anchors(dest):
                broken.append(f"{page.name}: {target}#{fragment} is no heading of {dest.name}")
    assert checked > 50
    assert not broken, broken


def test_the_anchor_rule_is_githubs() -> None:
    assert anchor("Key globs: `*` stops at `/`") == "key-globs--stops-at-"
    assert anchor("Redis deployments: one node, Cluster, Sentinel") == "redis-deployments-one-node-cluster-sentinel"
