"""Unique ids for completions and requests, without a system call per request.

A random 64-bit prefix drawn once per process (each worker imports this module afresh) plus a
counter: unique across replicas and restarts with overwhelming probability, and unlike
`os.urandom` per id it costs no syscall on the hot path. The ids are not secrets and must not be
used as such: `unguessable` is for the ids that are a handle on a tenant's objects.
"""

from __future__ import annotations

import itertools
import os
import secrets

_PREFIX = os.urandom(8).hex()
# The counter's hex digits, drawn by C code alone: counting from 2**32 + 1, the last eight digits are the
# counter from 1 (wrapping after 4 billion), as `f"{n & 0xFFFFFFFF:08x}"` would give them at a third of its cost.
_DIGITS = map(hex, itertools.count(2**32 + 1))


def unique_suffix() -> str:
    """24 hex characters: the process prefix and an 8-digit counter (wrapping after 4 billion)."""
    return _PREFIX + next(_DIGITS)[-8:]


def unguessable() -> str:
    """32 random hex characters (128 bits) drawn for this id alone: for ids a client holds as the handle on
    its objects (a batch, a file), where `unique_suffix` would show every caller the process prefix and a
    counter to step through to a neighbour's."""
    return secrets.token_hex(16)
