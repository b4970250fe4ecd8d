"""Scrubbing the gateway's own secrets out of upstream text before a client or a log line sees it.

Upstreams quote rejected credentials back, whole, as a prefix or masked; every secret the config holds
is cut out of relayed error text first. One linear pass of set lookups, no regex built from secrets,
nothing logged. What counts as a fragment or a masked form: docs/security.md (item 12).
"""

from __future__ import annotations

import logging
import re
import weakref
from collections.abc import Iterable, Iterator
from typing import Final
from urllib.parse import urlsplit

from gateway.config import LoadedConfig
from wire.errors import GatewayError, UpstreamError

REDACTED: Final = "[redacted]"
# The shortest run of a secret's characters that counts as a leak of it. Shorter runs are too common in
# ordinary text: keys are often made of words (`sk-...-upstream-...`), and 8 characters of one can be an
# English word, while 12 consecutive characters of a key are never in ordinary text.
FRAGMENT: Final = 12
# Secrets shorter than this are only matched whole: a 3-character "secret" would redact half of English.
MIN_SECRET: Final = 6
_MASKED_PREFIX: Final = 3  # `sk-` before a mask run
_MASKED_SUFFIX: Final = 4  # the last 4 characters after it, as OpenAI and most dashboards show them
_MASK_RUN: Final = re.compile(r"\*{2,}|\.{3,}|…+|•+")
# A configured header whose name says it carries a credential (its value is scrubbed like an api_key).
_CREDENTIAL_WORDS: Final = ("auth", "key", "token", "secret", "cookie", "password", "signature", "credential")
_TOKEN_CHARS: Final = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.~+/=:")


def _pieces(value: str) -> Iterator[str]:
    """A secret and the parts of it that are secrets on their own (`AKID:SECRET:TOKEN`, `Bearer xyz`)."""
    value = value.strip()
    yield value
    if ":" in value:
        yield from value.split(":")
    if " " in value:
        yield from value.split()


def _url_secrets(url: str | None) -> Iterator[str]:
    if not url or "@" not in url:
        return
    try:
        parts = urlsplit(url)
    except ValueError:
        return
    for piece in (parts.password, parts.username):
        if piece:
            yield piece


def config_secrets(loaded: LoadedConfig) -> set[str]:
    """Every credential value the loaded config holds, resolved (what would go on the wire)."""
    found: list[str] = []
    for provider in loaded.providers.values():
        found.extend(v for v in (provider.api_key, provider.client_key) if v)
        found.extend(_url_secrets(provider.base_url))
        found.extend(_url_secrets(provider.proxy))
        for deployment in provider.deployments.values():
            if deployment.api_key:
                found.append(deployment.api_key)
            found.extend(_url_secrets(deployment.base_url))
        for name, value in provider.headers.items():
            if any(word in name.lower() for word in _CREDENTIAL_WORDS):
                found.append(value)
    config = loaded.config
    found.extend(k.key for k in config.keys if k.key)
    found.extend(k for k in (config.admin.key, config.metrics.key) if k)
    return {p for value in found for p in _pieces(value) if len(p) >= MIN_SECRET}


class Scrubber:
    """Cuts the given secrets (and recognizable fragments of them) out of text; built once per config."""

    def __init__(self, secrets: Iterable[str], message_chars: int = 1000) -> None:
        self.message_chars = message_chars
        self._whole: list[str] = []  # secrets shorter than FRAGMENT: matched whole only
        self._grams: set[str] = set()
        self._prefixes: set[str] = set()
        self._suffixes: set[str] = set()
        for secret in secrets:
            if len(secret) < MIN_SECRET:
                continue
            if len(secret) < FRAGMENT:
                self._whole.append(secret)
            else:
                self._grams.update(secret[i : i + FRAGMENT] for i in range(len(secret) - FRAGMENT + 1))
            self._prefixes.update(secret[:n] for n in range(_MASKED_PREFIX, min(FRAGMENT, len(secret))))
            self._suffixes.update(secret[-n:] for n in range(_MASKED_SUFFIX, min(FRAGMENT, len(secret))))
        self.empty = not (self._whole or self._grams)

    @classmethod
    def from_config(cls, loaded: LoadedConfig) -> Scrubber:
        return cls(config_secrets(loaded), loaded.config.caps.upstream_message_chars)

    def scrub(self, text: str) -> str:
        """`text` without any secret or fragment of one; linear in its length."""
        if self.empty or not text:
            return text
        spans: list[tuple[int, int]] = []
        grams, k = self._grams, FRAGMENT
        if grams:
            for i in range(len(text) - k + 1):
                if text[i : i + k] in grams:
                    spans.append((i, i + k))
        for secret in self._whole:
            start = text.find(secret)
            while start != -1:
                spans.append((start, start + len(secret)))
                start = text.find(secret, start + 1)
        for run in _MASK_RUN.finditer(text):
            spans.extend(self._masked(text, run.start(), run.end()))
        if not spans:
            return text
        return _cut(text, spans)

    def _masked(self, text: str, start: int, end: int) -> Iterator[tuple[int, int]]:
        """A mask run with a secret's first characters before it or its last characters after it."""
        before = start
        while before > 0 and start - before < FRAGMENT and text[before - 1] in _TOKEN_CHARS:
            before -= 1
        after = end
        while after < len(text) and after - end < FRAGMENT and text[after] in _TOKEN_CHARS:
            after += 1
        head = text[before:start]
        tail = text[end:after]
        # The longest piece next to the run that is a secret's start (before it) or end (after it).
        lead = next((len(head) - i for i in range(len(head)) if head[i:] in self._prefixes), 0)
        trail = next((n for n in range(len(tail), _MASKED_SUFFIX - 1, -1) if tail[:n] in self._suffixes), 0)
        if lead or trail:
            yield (start - lead, end + trail)

    def message(self, text: str) -> str:
        """Upstream text for a client: scrubbed, then capped at `caps.upstream_message_chars`."""
        cap = self.message_chars
        # Scrub a little past the cap, so a secret straddling it is still recognized whole.
        text = self.scrub(text[: cap + 2 * FRAGMENT])
        return text if len(text) <= cap else text[: cap - 1] + "…"

    def error(self, exc: GatewayError) -> GatewayError:
        """An upstream error made safe to show: its message, code and param scrubbed and capped, once."""
        if isinstance(exc, UpstreamError) and not exc.scrubbed:
            return exc.evolve(
                message=self.message(exc.message),
                code=None if exc.code is None else self.message(str(exc.code)),
                param=None if exc.param is None else self.message(str(exc.param)),
                scrubbed=True,
            )
        return exc


def _cut(text: str, spans: list[tuple[int, int]]) -> str:
    """`text` with every span (merged where they overlap or touch) replaced by one REDACTED."""
    spans.sort()
    out: list[str] = []
    at = 0
    start, end = spans[0]
    for s, e in spans[1:]:
        if s <= end:
            end = max(end, e)
            continue
        out += (text[at:start], REDACTED)
        at, start, end = end, s, e
    out += (text[at:start], REDACTED, text[end:])
    return "".join(out)


# Every live config's scrubber, for the log filter (a reload makes a new one; the old goes with its pipeline).
_LIVE: weakref.WeakSet[Scrubber] = weakref.WeakSet()


class _LogFilter(logging.Filter):
    """Scrubs every record of the `gateway` logger, traceback included, before any handler formats it."""

    def filter(self, record: logging.LogRecord) -> bool:
        scrubbers = list(_LIVE)
        if not scrubbers:
            return True
        text = record.getMessage()
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        exc_text = record.exc_text
        for s in scrubbers:
            text = s.scrub(text)
            if exc_text:
                exc_text = s.scrub(exc_text)
        record.msg, record.args, record.exc_text = text, None, exc_text
        # Formatters print `exc_text` when set; the raw exception (its message, its frames) goes no further.
        record.exc_info = None
        return True


_FILTER: Final = _LogFilter()


def watch_logs(scrubber: Scrubber) -> None:
    """Scrub this config's secrets out of everything the `gateway` logger writes (installed once)."""
    _LIVE.add(scrubber)
    logger = logging.getLogger("gateway")
    if _FILTER not in logger.filters:
        logger.addFilter(_FILTER)


__all__ = ["REDACTED", "Scrubber", "config_secrets", "watch_logs"]
