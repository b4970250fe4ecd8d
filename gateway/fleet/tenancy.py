"""Whose a request is, as a fleet or an engine's prefix cache sees it: the identity its scope gives it
(`routing.session_scope`, a provider's `prefix_scope`: its key's, its team's, or nobody's in particular),
digested once per identity.

The digest keys the ring's session and prefix hashes (gateway/fleet/affinity.py), so two tenants' equal ids
or prefixes land independently, and derives the prefix-cache salt an engine that takes one is sent (a single
server as each replica), so two tenants on one engine share no cache entries either. The salt is always the
gateway's: a client's own is folded into its tenant's, so no salt a tenant sends can equal one another
tenant's requests carry.
"""

from __future__ import annotations

import hashlib
from typing import Final

import msgspec

from wire.schema import CompletionRequest

# Identities whose digests are kept (a key's, a team's): past it the table starts afresh, each digest then
# made again on its key's next request; the keys in force are far fewer.
MAX_OWNERS: Final = 4096
# The canonical field of a prefix-cache salt, and its key among `inference_extra_params` (merged over it).
SALT_FIELD: Final = "cache_salt"

# An identity ("key:<ident>", "team:<name>") -> the 32-byte key of its hashes and its requests' own salt.
_owners: dict[str, tuple[bytes, str]] = {}


def owner_of(scope: str) -> tuple[bytes, str]:
    """`scope`'s digest (the key of its ring hashes) and the salt of its requests that bring none; empty
    (shared, or a gateway without keys): no key and no salt, the hashes and a client's salt as they are."""
    found = _owners.get(scope)
    if found is None:
        if not scope:
            return b"", ""
        if len(_owners) >= MAX_OWNERS:
            _owners.clear()
        owner = hashlib.blake2b(scope.encode("utf-8", "surrogatepass"), digest_size=32, person=b"gw-owner").digest()
        found = _owners[scope] = (owner, _salt(owner, b"\x00"))
    return found


def _salt(owner: bytes, given: bytes) -> str:
    # Hex: within any engine's salt alphabet. 128 bits: no tenant finds another's by trying.
    return hashlib.blake2b(given, key=owner, digest_size=16, person=b"gw-salt").hexdigest()


def salt_for(scope: str, client: str | None) -> str | None:
    """The salt sent for a request of `scope` that brought `client` (None: none): the scope's own salt, or
    the client's keyed by the scope (a tenant may still keep its own requests apart with salts of its own);
    for an empty scope, the client's untouched."""
    owner, own = owner_of(scope)
    if not owner:
        return client
    if client is None:
        return own
    return _salt(owner, b"\x01" + client.encode())


def salted(req: CompletionRequest, scope: str) -> CompletionRequest:
    """`req` as sent to an engine that takes a prefix-cache salt, for a tenant of `scope`: its salt the one
    `salt_for` gives, and none left in `inference_extra_params`, which the adapter would merge over the field
    (a client's salt there is its salt, combined like the field's; a `null` there is no salt of its own)."""
    if not scope:
        return req
    extra = req.inference_extra_params
    if not extra or SALT_FIELD not in extra:
        return msgspec.structs.replace(req, cache_salt=salt_for(scope, req.cache_salt))
    rest = {k: v for k, v in extra.items() if k != SALT_FIELD}
    given = extra[SALT_FIELD]
    client = given if isinstance(given, str) else None  # checked at the door: a CacheSalt, or null
    return msgspec.structs.replace(req, cache_salt=salt_for(scope, client), inference_extra_params=rest or None)
