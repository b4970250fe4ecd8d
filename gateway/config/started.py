"""The config file as `serve` validated it, kept for its workers.

Each worker builds its app from the config file itself (uvicorn and Granian import an app factory in every
worker process). A worker started later (a replacement for one that died, uvicorn's restart on SIGHUP) reads
the file as it is then, which the operator may have left broken mid-edit: such a worker would fail and be
replaced again and again, a traceback each time, with one worker fewer serving meanwhile. So `serve` keeps
a private copy of the text it validated (a directory only its user can read, removed when it exits), and a
worker whose file no longer loads starts from that copy, saying why in one ERROR line; its config reloads
pick the file up again once it is valid (gateway/ops/reload.py).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

from gateway.config.loading import ConfigError, LoadedConfig, load_config, parse_config

log = logging.getLogger("gateway")

PATH_ENV = "GATEWAY_CONFIG"  # the config file every worker loads
KEPT_ENV = "GATEWAY_CONFIG_STARTED"  # the copy of the text `serve` validated, with several workers


def keep(text: str) -> Path:
    """Write `text` to a new private directory; the caller removes it with `forget` when it exits."""
    folder = Path(tempfile.mkdtemp(prefix="gateway-config-"))  # mode 0700: the config may hold secrets
    kept = folder / "config.yaml"
    fd = os.open(kept, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    return kept


def forget(kept: Path) -> None:
    shutil.rmtree(kept.parent, ignore_errors=True)


def for_worker() -> LoadedConfig:
    """The config a worker starts with: the file's, or the text `serve` validated when the file no longer
    loads (reported under the file's name, which its reloads go on watching)."""
    path = os.environ[PATH_ENV]
    try:
        return load_config(path)
    except ConfigError as exc:
        kept = os.environ.get(KEPT_ENV)
        if not kept:
            raise
        try:
            text = Path(kept).read_text(encoding="utf-8")
        except OSError:
            raise exc from None
        log.error("config error: %s; this worker starts with the config the gateway was started with", exc)
        return parse_config(text, path)
