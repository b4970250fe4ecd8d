"""nginx as the fixed-body upstream: the fastest loopback server available here.

nginx answers from C without touching the request body, so its ceiling is far above any Python
server; the bench still measures and publishes that ceiling so no ratio is read against an
unknown floor.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from bench.upstream import CHAT_BODY, COMPLETION_BODY

APT_HINT = "apt-get install -y nginx wrk"


def find_nginx() -> str | None:
    """Locate the nginx binary; Debian installs it in /usr/sbin, which is not always on PATH."""
    found = shutil.which("nginx")
    if found:
        return found
    candidate = Path("/usr/sbin/nginx")
    return str(candidate) if candidate.exists() else None


def render_config(port: int, prefix: Path) -> str:
    """Return an nginx.conf serving the fixed completion (a chat one on /v1/chat/completions) on 127.0.0.1:<port>.

    Every path nginx might write to is kept under ``prefix`` so the bench never touches
    /var/log/nginx or /run, and ``daemon off`` keeps nginx a child the bench can stop by pid.
    """
    body, chat = COMPLETION_BODY.decode(), CHAT_BODY.decode()
    if any("'" in text or "$" in text for text in (body, chat)):
        # The body goes into a single-quoted nginx string where $ would expand a variable.
        raise ValueError("completion body cannot be embedded in nginx config")
    temp = prefix / "tmp"
    return f"""
worker_processes 1;
daemon off;
master_process on;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
events {{
    worker_connections 4096;
}}
http {{
    access_log off;
    client_body_temp_path {temp}/body;
    proxy_temp_path {temp}/proxy;
    fastcgi_temp_path {temp}/fastcgi;
    uwsgi_temp_path {temp}/uwsgi;
    scgi_temp_path {temp}/scgi;
    # The default of 1000 requests per connection would make wrk reconnect mid-run.
    keepalive_requests 100000000;
    keepalive_timeout 75s;
    server {{
        listen 127.0.0.1:{port};
        location = /health {{
            default_type text/plain;
            return 200 'ok';
        }}
        location = /v1/chat/completions {{
            default_type application/json;
            return 200 '{chat}';
        }}
        location / {{
            default_type application/json;
            return 200 '{body}';
        }}
    }}
}}
"""


def prepare(port: int, prefix: Path) -> list[str]:
    """Write the config under ``prefix`` and return the argv that starts nginx in the foreground."""
    binary = find_nginx()
    if binary is None:
        raise FileNotFoundError(f"nginx not found; install it with: {APT_HINT}")
    (prefix / "tmp").mkdir(parents=True, exist_ok=True)
    conf = prefix / "nginx.conf"
    conf.write_text(render_config(port, prefix))
    # -e keeps even the pre-config startup log out of /var/log/nginx.
    return [binary, "-p", str(prefix), "-c", str(conf), "-e", str(prefix / "error.log")]
