"""A SQLite file opened as an operator's script would, and closed again.

`with sqlite3.connect(path) as conn` commits or rolls back at the block's end but leaves the connection
open until the collector finds it (Python 3.13 warns of it: an unclosed database).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


@contextmanager
def opened(path: str | Path, **options: Any) -> Iterator[sqlite3.Connection]:
    """`path` open for the block: committed at its end (rolled back if it raises), then closed."""
    conn = sqlite3.connect(path, **options)
    try:
        with conn:
            yield conn
    finally:
        conn.close()
