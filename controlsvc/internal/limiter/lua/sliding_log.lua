-- Sliding log: exact over the window. One ZSET entry per admitted call, scored
-- by its time; its member is the running sum ("cum") of every weight (cost +
-- lease) this log has admitted, this call's included, zero-padded so that the
-- members of one instant sort by it. The weight inside the window is then
--   C - cum(newest expired entry)
-- where C is the running sum now: two O(log n) lookups, whatever the call
-- costs and however many entries have expired. A call writes one entry.
--
-- Bookkeeping lives in the same ZSET under negative scores (times are
-- positive, and every time range below starts above 0): '#c' holds -C, '#b'
-- holds -(cum of the newest entry already removed).
--
-- Expired entries are removed lazily, at most `sweep` per call (freeing an
-- entry is the costliest step of a call, a microsecond or two): no count
-- depends on them, so removing them later changes no decision, and removing
-- more per call than a call adds keeps the log at its live size. A denial's
-- wait is a binary search over the live ranks (O(log^2 n)), so no step of a
-- call grows with its cost, its lease or the limit.
-- No lease is granted here: a log stamps what it admits when it admits it,
-- and leased tokens spent up to a lease's TTL later left the window that
-- much early (an outsider's 30 paths sharing one counter: 172 admitted in
-- a window of 100). The log is the exact algorithm; every request asks it.
local sweep = 16

local function member(cum) return string.format('%017.0f', cum) end

local function meta(name)
  local v = redis.call('ZSCORE', KEYS[1], name)
  if v then return -tonumber(v) end
  return nil
end

local function decide()
  local from = now - window
  local newest = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  local last = 0
  if newest[2] and tonumber(newest[2]) > 0 then last = tonumber(newest[2]) end
  local c, swept = meta('#c'), meta('#b') or 0
  fresh = c == nil and last == 0

  if c == nil and last > 0 then
    -- A log written by an older version (one entry per token, or weighted
    -- entries with '#total'): its weight becomes one entry at its newest time,
    -- which counts it a little longer than exactly (under-admits, once).
    c = meta('#total') or redis.call('ZCOUNT', KEYS[1], '(' .. num(from), '+inf')
    swept = 0
    if not peek then
      redis.call('UNLINK', KEYS[1]) -- freed off the main thread, however large
      redis.call('ZADD', KEYS[1], num(last), member(c), num(-c), '#c')
      redis.call('PEXPIRE', KEYS[1], math.max(1, math.ceil(last + window - now)))
    elseif last <= from then
      c = 0
    end
  end
  c = c or 0

  local base = swept
  local exp = redis.call('ZREVRANGEBYSCORE', KEYS[1], num(from), '(0', 'LIMIT', 0, 1)
  if exp[1] and tonumber(exp[1]) then base = math.max(base, tonumber(exp[1])) end
  local n = math.max(0, c - base)

  if not peek then
    local stale = redis.call('ZCOUNT', KEYS[1], '(0', num(from))
    if stale > 0 then
      -- The oldest entries, by rank: the bookkeeping members come first.
      local first = redis.call('ZCOUNT', KEYS[1], '-inf', '(0')
      local last_gone = first + math.min(stale, sweep) - 1
      -- Entries go oldest first, so the last one removed has the largest cum.
      local top = tonumber(redis.call('ZRANGE', KEYS[1], last_gone, last_gone)[1])
      redis.call('ZREMRANGEBYRANK', KEYS[1], first, last_gone)
      if top and top > swept then
        redis.call('ZADD', KEYS[1], num(-top), '#b')
      end
    end
  end

  local allowed, granted, retry = 0, 0, 0
  if n + cost <= limit then
    allowed = 1
    local w = cost
    n = n + w
    if not peek and w > 0 then
      c = c + w
      -- A clock that moved back (failover) stamps at the newest time, so
      -- time order stays cum order.
      last = math.max(now, last)
      redis.call('ZADD', KEYS[1], num(last), member(c), num(-c), '#c')
      redis.call('PEXPIRE', KEYS[1], math.ceil(last + window - now))
    end
  else
    -- Wait until the oldest entries whose weights cover what is missing have
    -- left the window: the first live rank whose cum reaches base + need. Cum
    -- grows with the rank (time order is cum order), so a binary search finds
    -- it in O(log n) probes of O(log n) each, however many entries it takes.
    -- Below the live ranks sit the bookkeeping members and expired entries
    -- not yet swept. A cost above the limit itself (never sent: the service
    -- refuses it) waits for the newest entry.
    local need = n + cost - limit
    retry = math.ceil(last + window - now)
    if need <= n then
      local lo = redis.call('ZCOUNT', KEYS[1], '-inf', num(from))
      local hi = redis.call('ZCARD', KEYS[1]) - 1
      while lo < hi do
        local mid = math.floor((lo + hi) / 2)
        local cum = tonumber(redis.call('ZRANGE', KEYS[1], mid, mid)[1])
        if cum and cum - base >= need then hi = mid else lo = mid + 1 end
      end
      local e = redis.call('ZRANGE', KEYS[1], lo, lo, 'WITHSCORES')
      if e[2] and tonumber(e[2]) > from then retry = math.ceil(tonumber(e[2]) + window - now) end
    end
    retry = math.max(1, retry)
  end
  local reset = 0
  if n > 0 and last > 0 then reset = math.max(0, math.ceil(last + window - now)) end
  return allowed, limit - n, reset, retry, granted
end
