# The gateway image: python:3.11-slim, the project installed as a package (no dev extras), a non-root
# user, the shipped config.yaml at /etc/gateway/config.yaml (docker-compose.yml mounts the operator's over
# it, read-only). Build: `docker build -t completions-gateway .`; run: see docs/deploy.md.

# ---- build: install the project and its dependencies into a self-contained virtualenv ----------------
FROM python:3.11-slim AS build

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
WORKDIR /src
# Only what the package is built from (tests/ops/test_packaging.py builds a wheel from exactly these).
COPY pyproject.toml README.md ./
COPY gateway ./gateway
COPY providers ./providers
COPY wire ./wire
# uvloop, httptools and msgspec come as manylinux wheels: no compiler is needed in the slim image.
RUN python -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-cache-dir . \
    && /opt/venv/bin/pip uninstall -y -q pip setuptools \
    && /opt/venv/bin/python -c "import gateway.edge.app, uvloop, httptools"

# ---- runtime: the virtualenv, the default config, a non-root user ------------------------------------
FROM python:3.11-slim

ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
RUN groupadd --system --gid 10001 gateway \
    && useradd --system --uid 10001 --gid gateway --no-create-home --shell /usr/sbin/nologin gateway
COPY --from=build /opt/venv /opt/venv
COPY config.yaml /etc/gateway/config.yaml
USER 10001:10001

EXPOSE 8080
# /ready: 200 once the config is loaded and Redis (when configured) answers; 503 otherwise. No curl in
# slim, so Python's urllib, with proxies disabled so an HTTP_PROXY in the environment cannot divert it.
HEALTHCHECK --interval=10s --timeout=3s --start-period=15s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request as u; r = u.build_opener(u.ProxyHandler({})).open('http://127.0.0.1:8080/ready', timeout=2); sys.exit(0 if r.status == 200 else 1)"]
# SIGTERM (docker stop) closes the listener at once and lets open requests and streams finish for up to
# server.shutdown_grace_ms (30 s by default); docker-compose.yml's stop_grace_period is longer than that.
STOPSIGNAL SIGTERM
CMD ["python", "-m", "gateway", "serve", "--config", "/etc/gateway/config.yaml", "--host", "0.0.0.0", "--port", "8080"]
