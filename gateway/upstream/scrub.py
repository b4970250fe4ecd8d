"""Scrubbing the gateway's own secrets out of upstream text before a client or a log line sees it.

Upstreams quote rejected credentials back, whole, as a prefix, masked, split or re-encoded (base64, hex,
`\\x` escapes, upper-cased); every secret the config holds is cut out of relayed error text first. One
linear pass of set lookups, no regex built from secrets, nothing logged. What counts as a fragment, an
encoded or a masked form: docs/security.md (item 12).
"""

from __future__ import annotations

import base64
import logging
import re
import weakref
from collections.abc import Iterable, Iterator
from typing import Final
from urllib.parse import parse_qsl, urlsplit

from gateway.config import LoadedConfig
from wire.errors import GatewayError, UpstreamError, snake_code

REDACTED: Final = "[redacted]"
# The shortest run of a secret's characters that counts as a leak of it. Shorter runs are too common in
# ordinary text: keys are often made of words (`sk-...-upstream-...`), and 8 characters of one can be an
# English word, while 12 consecutive characters of a key are never in ordinary text.
FRAGMENT: Final = 12
# A shorter run still counts when it mixes letters and digits (`7Qm2xV9p`): a key split into pieces under
# FRAGMENT characters is caught piece by piece, and such a run of a random key is not ordinary text.
MIXED_FRAGMENT: Final = 8
# Secrets shorter than this are only matched whole: a 3-character "secret" would redact half of English.
MIN_SECRET: Final = 6
_MASKED_PREFIX: Final = 3  # `sk-` before a mask run
_MASKED_SUFFIX: Final = 4  # the last 4 characters after it, as OpenAI and most dashboards show them
_MASK_RUN: Final = re.compile(r"\*{2,}|\.{3,}|…+|•+")
# A configured header whose name says it carries a credential (its value is scrubbed like an api_key).
_CREDENTIAL_WORDS: Final = ("auth", "key", "token", "secret", "cookie", "password", "signature", "credential")
_TOKEN_CHARS: Final = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.~+/=:")
# Encoded forms are matched on runs standing for 8 bytes of the secret or more (base64: 9, whole groups).
_HEX_RUN: Final = 16
_ESCAPED_RUN: Final = 32  # `\x73\x6b...`: 4 characters a byte
_BASE64_RUN: Final = 12
# Where hex and escaped forms can be at all: only these runs are searched for them, so the two longer run
# lengths cost a pass of C over ordinary text rather than a set lookup per position. Fixed and unambiguous
# (every repetition starts with a character the one before cannot end with): linear, no backtracking.
_ENCODED_RUNS: Final = {
    _HEX_RUN: re.compile(r"[0-9a-fA-F]{16,}"),
    _ESCAPED_RUN: re.compile(r"(?:\\x[0-9a-fA-F]{2}){8,}"),
}


def _pieces(value: str) -> Iterator[str]:
    """A secret and the parts of it that are secrets on their own (`AKID:SECRET:TOKEN`, `Bearer xyz`)."""
    value = value.strip()
    yield value
    if ":" in value:
        yield from value.split(":")
    if " " in value:
        yield from value.split()


def _url_secrets(url: str | None, users: bool = True) -> Iterator[str]:
    """The credentials in `url`'s userinfo; without `users`, its password alone (a store's user, `postgres` or
    `default`, is a word a log line says for other reasons, and no store gets the pair as Basic auth)."""
    if not url or "@" not in url:
        return
    try:
        parts = urlsplit(url)
    except ValueError:
        return
    if parts.password:
        yield parts.password
    if not users:
        return
    if parts.username:
        yield parts.username
    if parts.username and parts.password:
        # What goes on the wire as Basic auth (base64 of `user:password`, one of its encoded forms).
        yield f"{parts.username}:{parts.password}"


def _query_secrets(url: str | None) -> Iterator[str]:
    """Passwords given as URL options (`?password=`, Sentinel's `sentinel_password=`)."""
    if not url or "password" not in url:
        return
    for name, value in parse_qsl(url.partition("?")[2]):
        if "password" in name.lower() and value:
            yield value


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
    for store in (config.redis.url, config.ledger.url):  # a driver's error text may quote its URL
        found.extend(_url_secrets(store, users=False))
        found.extend(_query_secrets(store))
    return {p for value in found for p in _pieces(value) if len(p) >= MIN_SECRET}


def _base64_forms(raw: bytes) -> Iterator[str]:
    """The characters of `raw`'s base64 that do not depend on its neighbours, at each of the 3 alignments it
    can have inside a longer encoded value (`Basic base64(user:key)`, a JSON document echoed encoded)."""
    for shift in range(3):
        enc = base64.b64encode(b"\0" * shift + raw).decode("ascii")
        # The group holding the shifted-in bytes and the last (padded) group depend on what surrounds it.
        inner = enc[4 if shift else 0 : len(enc) - 4]
        yield inner
        if not shift:
            yield enc.rstrip("=")


def encoded_forms(secret: str) -> Iterator[tuple[int, str]]:
    """`secret` as upstreams re-encode it, each with the shortest run of it that counts as a leak."""
    yield FRAGMENT, secret
    for cased in {secret.upper(), secret.lower()} - {secret}:
        yield FRAGMENT, cased
    raw = secret.encode()
    for form in _base64_forms(raw):
        yield _BASE64_RUN, form
        yield _BASE64_RUN, form.translate(_URLSAFE)
    for hexed in (raw.hex(), raw.hex().upper()):
        yield _HEX_RUN, hexed
        escaped = "".join("\\x" + hexed[i : i + 2] for i in range(0, len(hexed), 2))
        yield _ESCAPED_RUN, escaped


_URLSAFE: Final = str.maketrans("+/", "-_")


def _mixed(run: str) -> bool:
    return any(c.isdigit() for c in run) and any(c.isalpha() for c in run)


class Scrubber:
    """Cuts the given secrets (and recognizable fragments and encodings of them) out of text; built once per
    config."""

    def __init__(self, secrets: Iterable[str], message_chars: int = 1000) -> None:
        self.message_chars = message_chars
        self._whole: list[str] = []  # secrets shorter than FRAGMENT: matched whole only
        # Run length -> every run of that length of a secret (or of an encoded form) that counts as a leak.
        grams: dict[int, set[str]] = {}
        self._prefixes: set[str] = set()
        self._suffixes: set[str] = set()
        for secret in secrets:
            if len(secret) < MIN_SECRET:
                continue
            if len(secret) < FRAGMENT:
                self._whole.append(secret)
            for k, form in encoded_forms(secret):
                if len(form) >= k:
                    grams.setdefault(k, set()).update(form[i : i + k] for i in range(len(form) - k + 1))
            for cased in {secret, secret.upper(), secret.lower()}:
                if len(cased) >= FRAGMENT:
                    mixed = (cased[i : i + MIXED_FRAGMENT] for i in range(len(cased) - MIXED_FRAGMENT + 1))
                    grams.setdefault(MIXED_FRAGMENT, set()).update(m for m in mixed if _mixed(m))
            self._prefixes.update(secret[:n] for n in range(_MASKED_PREFIX, min(FRAGMENT, len(secret))))
            self._suffixes.update(secret[-n:] for n in range(_MASKED_SUFFIX, min(FRAGMENT, len(secret))))
        self._grams = sorted((k, g) for k, g in grams.items() if g)
        self.empty = not (self._whole or self._grams)

    @classmethod
    def from_config(cls, loaded: LoadedConfig) -> Scrubber:
        return cls(config_secrets(loaded), loaded.config.caps.upstream_message_chars)

    def spans(self, text: str) -> list[tuple[int, int]]:
        """Where `text` holds a secret, a fragment, an encoded form or a masked form of one; linear in its
        length (a set lookup per position and run length, a handful of lengths)."""
        spans: list[tuple[int, int]] = []
        if self.empty or not text:
            return spans
        for k, grams in self._grams:
            runs = _ENCODED_RUNS.get(k)
            bounds = [(0, len(text))] if runs is None else [m.span() for m in runs.finditer(text)]
            for start, end in bounds:
                for i in range(start, end - k + 1):
                    if text[i : i + k] in grams:
                        spans.append((i, i + k))
        for secret in self._whole:
            start = text.find(secret)
            while start != -1:
                spans.append((start, start + len(secret)))
                start = text.find(secret, start + 1)
        for run in _MASK_RUN.finditer(text):
            spans.extend(self._masked(text, run.start(), run.end()))
        return spans

    def scrub(self, text: str) -> str:
        """`text` without any secret or fragment of one; linear in its length."""
        spans = self.spans(text)
        return _cut(text, spans) if spans else text

    def scrub_together(self, *texts: str) -> list[str]:
        """Each of `texts` scrubbed as if they were one text: a key split across them (half in an error's
        message, half in its `param`) is cut from both."""
        joined = "".join(texts)
        spans = self.spans(joined)
        if not spans:
            return list(texts)
        out: list[str] = []
        at = 0
        for text in texts:
            end = at + len(text)
            mine = [(max(s, at) - at, min(e, end) - at) for s, e in spans if s < end and e > at]
            out.append(_cut(text, mine) if mine else text)
            at = end
        return out

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

    def _cap(self, text: str) -> str:
        cap = self.message_chars
        return text if len(text) <= cap else text[: cap - 1] + "…"

    def message(self, text: str) -> str:
        """Upstream text for a client: scrubbed, then capped at `caps.upstream_message_chars`."""
        # Scrub a little past the cap, so a secret straddling it is still recognized whole.
        return self._cap(self.scrub(text[: self.message_chars + 2 * FRAGMENT]))

    def error(self, exc: GatewayError) -> GatewayError:
        """An upstream error made safe to show: its message, code and param scrubbed and capped, once."""
        if isinstance(exc, UpstreamError) and not exc.scrubbed:
            message = exc.message
            # A client's `code` is snake_case: an upstream's own code is kept when it is one (or differs only in
            # case and separators: `RESOURCE_EXHAUSTED`, `ThrottlingException`). A number, free text, a code
            # holding a secret, or none becomes `upstream_<cause>` (`upstream_http_500`); the upstream's own
            # code then ends the message, where it is scrubbed like the rest.
            raw = None if exc.code is None else str(exc.code)
            code = snake_code(raw)
            if code is None or self.scrub(code) != code:
                code = f"upstream_{exc.cause}" if exc.cause else "upstream_error"
                if raw:
                    message = f"{message} (upstream code {raw})"
            # Message and param are relayed side by side: scrubbed together, so a key split between them is cut.
            margin = self.message_chars + 2 * FRAGMENT
            param = None if exc.param is None else str(exc.param)[:margin]
            message, param_text = self.scrub_together(message[:margin], param or "")
            return exc.evolve(
                message=self._cap(message),
                code=code,
                param=None if param is None else self._cap(param_text),
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
