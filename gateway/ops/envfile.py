"""`.env` files: `VAR=value` lines read into the environment before the config is loaded.

docker compose gives the gateway the variables of `.env` (its `env_file`); `python -m gateway serve` reads
the same file itself, so `make run` and compose see the same keys. The format is the one `.env.example`
documents, which compose also reads: one `VAR=value` per line, `#` comments and blank lines ignored, an
optional `export ` prefix, and a value in matching single or double quotes taken without them. A variable
already set in the environment keeps its value: the environment wins over the file, as in compose's
`environment:` over its `env_file`.
"""

from __future__ import annotations

import os
import re
from collections.abc import MutableMapping
from pathlib import Path
from typing import Final

_LINE: Final = re.compile(r"^(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*)$")


class EnvFileError(Exception):
    """A line that is not `VAR=value`: `<file>:<line>: <problem>` (the value is never quoted back)."""


def parse(text: str, source: str) -> dict[str, str]:
    values: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        found = _LINE.match(line)
        if found is None:
            # Only what precedes `=` is shown: the rest may be a secret.
            name = line.partition("=")[0].strip()[:40]
            raise EnvFileError(f"{source}:{number}: expected VAR=value, got {name!r}")
        name, value = found.group(1), found.group(2).strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        values[name] = value
    return values


def load(path: Path, environ: MutableMapping[str, str] | None = None) -> list[str]:
    """Set the file's variables that `environ` (default: os.environ) lacks; the names set, in file order."""
    env = os.environ if environ is None else environ
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise EnvFileError(f"{path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise EnvFileError(f"{path}: not UTF-8 text") from None
    applied: list[str] = []
    for name, value in parse(text, str(path)).items():
        if name not in env:
            env[name] = value
            applied.append(name)
    return applied
