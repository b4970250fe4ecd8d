"""The bench's own stores: stopping one leaves no server behind, even when `runuser` stands in between (as root)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from bench import stores


def _running_with(marker: str) -> list[int]:
    """Pids whose command line mentions `marker`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline and int(entry.name) != os.getpid():
            found.append(int(entry.name))
    return found


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def test_postgres_stops_with_the_store() -> None:
    store = stores.start_postgres()
    assert store.home is not None
    home, port = str(store.home), int(store.url.rsplit(":", 1)[1].split("/")[0])
    assert _running_with(home), "postgres should be running from the store's directory"
    assert _accepts(port)
    store.stop()
    assert _running_with(home) == []
    assert not _accepts(port)


def test_redis_stops_with_the_store() -> None:
    store = stores.start_redis()
    port = int(store.url.rsplit(":", 1)[1].split("/")[0])
    assert _accepts(port)
    store.stop()
    assert store.proc.poll() is not None
    assert not _accepts(port)
