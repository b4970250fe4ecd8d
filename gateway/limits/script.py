"""The rate-limit script: one atomic Lua call that checks and charges every bucket of a request, or none.

GCRA for rate buckets, sorted-set leases for `concurrent` (one at a time, or a block of them for the fair
queue), on Redis's own clock. `gcra` in gateway/limits/gcra.py is the same arithmetic in Python
(tests/ratelimit/test_script.py holds the two together, decision by decision); the algorithm and key
layout: docs/ratelimits.md.
"""

from __future__ import annotations

from typing import Final

# KEYS: one per bucket. ARGV: mode, lease id, then per bucket: kind, limit, period_ms, cost.
# mode "batch": several such calls in one (the channel merges the calls of one loop tick): KEYS are every
#   call's keys in turn, ARGV is "batch" then per call its key count and its own ARGV; each call is decided
#   as if it ran alone, in order, on one reading of the clock, and the reply is the list of their replies.
# mode "acquire": all-or-nothing check and charge; returns {ok, retry_ms, b1_remaining, b1_reset_ms, ...}
# mode "share": as "acquire", but a rate bucket's kind argument is its ceiling, the most q = (TAT - now) * limit
#   the charge may leave (`Bucket.ceiling`: part of period * limit), and a concurrency bucket's limit is the
#   leases this call may find held: a batch line's view of a shared bucket, leaving the rest to other calls.
# mode "adjust": add cost (may be negative: a refund) without checking; returns {1, 0, ...}
# mode "block": as "acquire" on one concurrency bucket, for `cost` leases at once (ids `lease/1`..`lease/cost`).
# mode "release": drop the lease from concurrency buckets (its acquire is known to have run).
# mode "refresh": push a held lease's expiry a TTL ahead, so a request that outlives the TTL keeps its slot, and
#   write it again if Redis lost it; never over a cancel marker. Only the limiter's leases still held are
#   refreshed, each before its release on the same connection, so a released lease is never written again.
# mode "cancel": drop the lease and leave a marker, for a lease whose acquire may not have run yet: an
#   acquire sent before a timeout can still be run by Redis after the cancel (it sat unread in a dropped
#   connection), and must then write nothing.
# A concurrency bucket is one sorted set: live leases scored by their expiry (> 0), cancel markers by
# minus theirs (< 0), so both expire on Redis's clock and stay in the one key (and slot) the script names.
_SCRIPT: Final = """
local call, floor, ceil, max, find, sub = redis.call, math.floor, math.ceil, math.max, string.find, string.sub
local tonumber, format = tonumber, string.format
-- An argument's number: in a merged call each distinct text converted once (its calls repeat the same limits,
-- periods and costs, and tonumber's strtod is dearer than a table lookup); alone, converted as read (a call
-- reads each text about once, and a table's growth costs more than it saves).
local nums = {}
local num = tonumber
if ARGV[1] == 'batch' then
  num = function(s)
    local v = tonumber(s)
    nums[s] = v
    return v
  end
end
local t = call('TIME')
local now = tonumber(t[1]) * 1000 + floor(tonumber(t[2]) / 1000)
-- A rate bucket is read at most once and written at most once per script call, however many calls of a
-- batch charge it: `slot[key]` is the key's place j in `st`, which holds at j the key, then its base and
-- units as the calls so far left them, then the PX of its last charge (false while nothing charged it).
-- They are written at the end: the last charge's value and TTL, which is what sequential SETs leave.
-- `w` holds the call being decided, per bucket i at 4i-3: its new base (or 'lease', or false), units, PX
-- and q. Tables are few and made once per script call: each table and each growth costs Redis more
-- than the arithmetic (hence the sizes they start with).
local slot, used = {}, 0
local st = {false, false, false, false, false, false, false, false}
local w = {false, false, false, false, false, false, false, false, false, false, false, false}
local function one(k, n, a)
  local mode, lease = ARGV[a + 1], ARGV[a + 2]
  -- Made at its final size for the common bucket counts: each growth of a table costs Redis a reallocation.
  local out
  if n == 2 then out = {1, 0, 0, 0, 0, 0} elseif n == 1 then out = {1, 0, 0, 0} else out = {1, 0} end
  local denied = false
  local retry = 0
  local leased = false
  for i = 1, n do
    local base, o = a + 2 + (i - 1) * 4, 4 * i - 3
    local kind, sl, sp, sc = ARGV[base + 1], ARGV[base + 2], ARGV[base + 3], ARGV[base + 4]
    local limit, period, cost = nums[sl] or num(sl), nums[sp] or num(sp), nums[sc] or num(sc)
    if kind == 'concurrent' then
      local key = KEYS[k + i]
      call('ZREMRANGEBYSCORE', key, 0, now)
      w[o] = false
      if mode == 'release' then
        call('ZREM', key, lease)
        out[2 * i + 1] = 0; out[2 * i + 2] = 0
      elseif mode == 'refresh' then
        -- A lease Redis no longer has (a restart or a failover lost it, or it expired while Redis did not
        -- answer) is written again: its request still runs. Never over a cancel marker (< 0).
        local score = call('ZSCORE', key, lease)
        if not score or tonumber(score) > 0 then
          call('ZADD', key, now + LEASE_TTL, lease)
          call('PEXPIRE', key, LEASE_TTL)
        end
        out[2 * i + 1] = 0; out[2 * i + 2] = 0
      elseif mode == 'cancel' then
        call('ZREMRANGEBYSCORE', key, -now, -1)
        call('ZADD', key, -(now + LEASE_TTL), lease)
        call('PEXPIRE', key, LEASE_TTL)
        out[2 * i + 1] = 0; out[2 * i + 2] = 0
      else
        local held = call('ZCOUNT', key, '(0', '+inf')
        local want = 1
        if mode == 'block' then want = cost end
        if mode ~= 'adjust' and held + want > limit then
          denied = true
          -- A slot frees when any request ends, which nobody knows: retry soon (the oldest lease's expiry
          -- is only a bound, up to ten minutes away).
          local oldest = call('ZRANGEBYSCORE', key, 1, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
          local wait = 1000
          if oldest[2] then wait = max(math.min(tonumber(oldest[2]) - now, 1000), 1) end
          if wait > retry then retry = wait end
        end
        w[o] = 'lease'
        leased = true
        out[2 * i + 1] = max(limit - held - want, 0); out[2 * i + 2] = 0
      end
    else
      -- TAT = base + units * period / limit, kept as a whole millisecond and a count of units so that the
      -- arithmetic is exact in integers: q = (TAT - now) * limit. (A TAT in float milliseconds drifts by
      -- rounding at 1.7e12 and refused the last unit of a burst when period / limit is not whole.)
      local key = KEYS[k + i]
      local j = slot[key]
      local tb, tu
      if j then
        tb, tu = st[j + 1], st[j + 2]
      else
        tb, tu = now, 0
        local raw = call('GET', key)
        if raw then
          local c = find(raw, ':', 1, true)
          if c then tb, tu = tonumber(sub(raw, 1, c - 1)), tonumber(sub(raw, c + 1)) else tb = floor(tonumber(raw)) end
        end
        j = used + 1
        used = used + 4
        slot[key] = j
        st[j], st[j + 1], st[j + 2], st[j + 3] = key, tb, tu, false
      end
      local q = (tb - now) * limit + tu * period
      if q < 0 then tb, tu, q = now, 0, 0 end
      local nu, nq = tu + cost, q + cost * period
      if mode == 'adjust' and nq < 0 then tb, nu, nq = now, 0, 0 end
      -- How far past what it may fill the charge would take the bucket: all of it (period * limit), or in
      -- 'share' mode the ceiling the kind's argument carries (a batch line's share of a shared bucket).
      local over = 0
      if mode == 'acquire' then
        over = nq - period * limit
      elseif mode == 'share' then
        over = nq - (nums[kind] or num(kind))
      end
      if over > 0 then
        denied = true
        local wait = ceil(over / limit)
        if wait > retry then retry = wait end
      end
      local whole = floor(nu / limit)
      w[o], w[o + 1], w[o + 2], w[o + 3] = tb + whole * period, nu - whole * limit, ceil(nq / limit) + 1000, q
      out[2 * i + 1] = max(floor((period * limit - nq) / period), 0); out[2 * i + 2] = ceil(nq / limit)
    end
  end
  if mode == 'release' or mode == 'cancel' or mode == 'refresh' then return out end
  if denied then
    -- Report what the buckets hold now: the denied request charged nothing.
    out[1] = 0; out[2] = retry
    for i = 1, n do
      local o = 4 * i - 3
      local v = w[o]
      if v and v ~= 'lease' then
        local q = w[o + 3]
        local limit, period = tonumber(ARGV[a + 2 + i * 4 - 2]), tonumber(ARGV[a + 2 + i * 4 - 1])
        out[1 + i * 2] = max(floor((period * limit - q) / period), 0); out[2 + i * 2] = ceil(q / limit)
      end
    end
    return out
  end
  -- Leases first: ZADD NX meets this id's cancel marker when the acquire runs after its cancel (it sat
  -- unread in a dropped connection), and then nothing at all is written, rate buckets included.
  if leased then
    local added = {}
    for i = 1, n do
      if w[4 * i - 3] == 'lease' then
        local ids = {lease}
        if mode == 'block' then
          ids = {}
          for j = 1, tonumber(ARGV[a + 6]) do ids[j] = lease .. '/' .. j end
        end
        for _, id in ipairs(ids) do
          if call('ZADD', KEYS[k + i], 'NX', now + LEASE_TTL, id) == 0 then
            for _, e in ipairs(added) do call('ZREM', e[1], e[2]) end
            out[1] = 0
            return out
          end
          added[#added + 1] = {KEYS[k + i], id}
        end
      end
    end
  end
  for i = 1, n do
    local o = 4 * i - 3
    local v = w[o]
    if v == 'lease' then
      call('PEXPIRE', KEYS[k + i], LEASE_TTL)
    elseif v then
      local j = slot[KEYS[k + i]]
      st[j + 1], st[j + 2], st[j + 3] = v, w[o + 1], w[o + 2]
    end
  end
  return out
end
local replies
if ARGV[1] == 'batch' then
  -- Several calls in one: ARGV is 'batch', then per call its key count, mode, lease and buckets; KEYS are
  -- every call's keys in turn. Each is decided as if it ran alone, in order; the reply is one per call.
  local k, a = 0, 1
  replies = {}
  while a < #ARGV do
    local n = nums[ARGV[a + 1]] or num(ARGV[a + 1])
    replies[#replies + 1] = one(k, n, a + 1)
    k, a = k + n, a + 3 + 4 * n
  end
else
  replies = one(0, #KEYS, 0)
end
for j = 1, used, 4 do
  local px = st[j + 3]
  if px then
    -- Whole numbers (every integer cost) as integers: the same text as %.17g writes, without its digit
    -- generation for doubles; a fractional cost's value keeps all 17 digits.
    local b, u = st[j + 1], st[j + 2]
    local v
    if b == floor(b) and u == floor(u) and b < 2^53 and u < 2^53 and b > -2^53 and u > -2^53 then
      v = format('%d:%d', b, u)
    else
      v = format('%.17g:%.17g', b, u)
    end
    call('SET', st[j], v, 'PX', format('%d', px))
  end
end
return replies
"""


def script_text(lease_ttl_ms: int) -> str:
    """The script with its lease TTL (`redis.lease_ttl_ms`) written in: one script (and SHA) per TTL."""
    return _SCRIPT.replace("LEASE_TTL", str(lease_ttl_ms))
