-- Sliding log: one ZSET entry per spent token, scored by its time; exact, and
-- the costliest in memory. Leases are not given back here (a refund cannot tell
-- leased entries from spent ones), so a lease may only under-admit.
local function decide()
  local from = now - window
  local n
  if peek then
    n = redis.call('ZCOUNT', KEYS[1], '(' .. num(from), '+inf')
  else
    redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', num(from))
    n = redis.call('ZCARD', KEYS[1])
  end
  local allowed, granted, retry = 0, 0, 0
  if n + cost <= limit then
    allowed = 1
    granted = grant(limit - n - cost)
    if not peek then
      local stamp = num(now)
      for i = 1, cost + granted do
        -- n + i is unique among entries of this instant: n only grows within it.
        redis.call('ZADD', KEYS[1], stamp, stamp .. '-' .. (n + i))
      end
      redis.call('PEXPIRE', KEYS[1], math.ceil(window))
    end
    n = n + cost + granted
  else
    -- Wait until enough of the oldest entries have left the window.
    local e = redis.call('ZRANGE', KEYS[1], n + cost - limit - 1, n + cost - limit - 1, 'WITHSCORES')
    retry = math.max(1, math.ceil(tonumber(e[2]) + window - now))
  end
  local reset = 0
  local newest = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  if newest[2] then reset = math.ceil(tonumber(newest[2]) + window - now) end
  return allowed, limit - n, reset, retry, granted
end
