"""bench/report_template.md read as named blocks of markdown with `${name}` placeholders."""

from __future__ import annotations

import re
import string
from pathlib import Path


class Template:
    """bench/report_template.md: named blocks of markdown with `${name}` placeholders (its head says how)."""

    def __init__(self, path: Path) -> None:
        self.blocks: dict[str, list[str]] = {}
        name: str | None = None
        for line in path.read_text().split("\n"):
            if line.startswith("@@ "):
                name = line[3:].strip()
                self.blocks[name] = []
            elif name is not None:
                self.blocks[name].append(line)

    def fill(self, name: str, **values: object) -> str:
        """The block with its values; a line that is only a placeholder goes when its value is empty."""
        kept = [
            line
            for line in self.blocks[name]
            if not ((alone := _ALONE.fullmatch(line)) and values[alone.group(1)] in ("", None))
        ]
        return string.Template("\n".join(kept).rstrip("\n")).substitute(values)

    def section(self, name: str, **values: object) -> str:
        """A block that stands on its own lines, followed by a blank line."""
        return self.fill(name, **values) + "\n"


_ALONE = re.compile(r"\$\{(\w+)\}")
