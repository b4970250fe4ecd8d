"""Spend counters in Redis that stop at the largest 64-bit integer instead of overflowing.

Spend is integer picodollars: a signed 64-bit counter holds about $9.2 million. Redis refuses an INCRBY or
HINCRBY past it with an error, which the gateway cannot tell from an outage: every write that carries the
counter would fail, and with it the others of its pipeline (every replica's usage, every budget's spend),
each replica falling back to its own state. Past the bound the counter stays at it: a key that spent that
much in one day (or a budget that much in one period) is reported at the bound. A budget's reservations rise
and fall, so their counter keeps what went past the bound beside it instead (`RESERVE_LUA`). Docs:
docs/operations.md#prices.
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
# Lua: `reserve(key, by)` adds `by` (negative: gives back) to the hash's `reserved` field. Past INT64_MAX the
# field stays at it and the excess goes to `reserved_past` (itself stopping at INT64_MAX); what is given back
# comes off `reserved_past` first, so `reserved` is exact again once the reservations in flight fit in 64 bits.
# Lua numbers are doubles: every sum is Redis's own 64-bit arithmetic, Lua only compares signs. Returns the
# `reserved` field as a string (a number past 2**53 would reach the caller rounded).
RESERVE_LUA: Final = f"""
local function reserve(key, by)
  if string.sub(by, 1, 1) == '-' then
    local past = redis.call('HGET', key, 'reserved_past')
    if past and past ~= '0' then
      if redis.call('HINCRBY', key, 'reserved_past', by) >= 0 then
        return redis.call('HGET', key, 'reserved')
      end
      by = redis.call('HGET', key, 'reserved_past')  -- what is left to give back, exactly
      redis.call('HDEL', key, 'reserved_past')
    end
  end
  local added = redis.pcall('HINCRBY', key, 'reserved', by)
  if type(added) == 'table' and added.err then
    if not string.find(added.err, 'overflow', 1, true) then
      return redis.error_reply(added.err)
    end
    if string.sub(by, 1, 1) == '-' then
      redis.call('HSET', key, 'reserved', '{-INT64_MAX - 1}')
    else
      redis.call('HINCRBY', key, 'reserved', '-{INT64_MAX}')
      redis.call('HINCRBY', key, 'reserved', by)
      local over = redis.call('HGET', key, 'reserved')  -- the excess, exactly
      redis.call('HSET', key, 'reserved', '{INT64_MAX}')
      local past = redis.pcall('HINCRBY', key, 'reserved_past', over)
      if type(past) == 'table' and past.err then
        redis.call('HSET', key, 'reserved_past', '{INT64_MAX}')
      end
    end
  end
  return redis.call('HGET', key, 'reserved')
end
"""
_RESERVE: Final = RESERVE_LUA + "return reserve(KEYS[1], ARGV[1])\n"
_ADD: Final = ADD_LUA + "local failed = add(KEYS[1], ARGV[1], ARGV[2])\nif failed then return failed end\nreturn 0\n"


def add(r: Any, key: str, field: str, by: int) -> Any:
    """Add `by` >= 0 to `key`'s hash field `field` ('' : to the string counter `key`), stopping at INT64_MAX:
    queued on `r` when it is a pipeline; on a client, the call to await."""
    return r.eval(_ADD, 1, key, field, min(by, INT64_MAX))


def reserve(r: Any, key: str, by: int) -> Any:
    """Add `by` to `key`'s `reserved` field as `RESERVE_LUA` does; the field's value after it (as bytes), queued on
    `r` when it is a pipeline; on a client, the call to await."""
    return r.eval(_RESERVE, 1, key, bounded(by))


def bounded(by: int) -> int:
    """`by` within what one HINCRBY takes (a sum of changes owed while Redis was away may be past it)."""
    return max(-INT64_MAX, min(by, INT64_MAX))
