"""Spend counters in Redis that stop at the largest 64-bit integer instead of overflowing.

Spend is integer picodollars: a signed 64-bit counter holds about $9.2 million. Redis refuses an INCRBY or
HINCRBY past it with an error, which the gateway cannot tell from an outage: every write that carries the
counter would fail, and with it the others of its pipeline (every replica's usage, every budget's spend),
each replica falling back to its own state. Past the bound the counter stays at it: a key that spent that
much in one day (or a budget that much in one period) is reported at the bound. Docs: docs/operations.md#prices.
"""

from __future__ import annotations

from typing import Any, Final

INT64_MAX: Final = 2**63 - 1

# Lua: `add(key, field, by)` adds `by` to the hash field (field '': to the string counter `key`), stopping at
# INT64_MAX. Any other error (a key of another type) is raised as the plain command raises it.
ADD_LUA: Final = f"""
local function add(key, field, by)
  local added
  if field == '' then
    added = redis.pcall('INCRBY', key, by)
  else
    added = redis.pcall('HINCRBY', key, field, by)
  end
  if type(added) == 'table' and added.err then
    if not string.find(added.err, 'overflow', 1, true) then
      return redis.error_reply(added.err)
    end
    if field == '' then
      redis.call('SET', key, '{INT64_MAX}')
    else
      redis.call('HSET', key, field, '{INT64_MAX}')
    end
  end
end
"""
_ADD: Final = ADD_LUA + "local failed = add(KEYS[1], ARGV[1], ARGV[2])\nif failed then return failed end\nreturn 0\n"


def add(r: Any, key: str, field: str, by: int) -> Any:
    """Add `by` >= 0 to `key`'s hash field `field` ('' : to the string counter `key`), stopping at INT64_MAX:
    queued on `r` when it is a pipeline; on a client, the call to await."""
    return r.eval(_ADD, 1, key, field, min(by, INT64_MAX))
