-- Sliding log: exact over the window, and the costliest in memory. One ZSET
-- entry per admitted call, scored by its time, its member "<time>-<seq>:<weight>"
-- carrying what the call spent (cost + lease), so a call writes one entry
-- whatever its cost. The running total of the weights lives in the same ZSET
-- as the member "#total" with a negative score (-total): times are positive,
-- so range queries by time never see it, and the count costs O(1).
--
-- Work per call is bounded: at most `sweep` expired entries are removed (and
-- subtracted) per call. If more are expired, the total still counts them until
-- later calls sweep them, which can only under-admit. Leases are not given back
-- here (a refund cannot tell leased weight from spent), so a lease may only
-- under-admit.
local sweep = 64
local TOTAL = '#total'

local function weight_of(member)
  return tonumber(string.match(member, ':(%d+)$')) or 1
end

local function decide()
  local from = now - window
  local total = tonumber(redis.call('ZSCORE', KEYS[1], TOTAL))
  if total == nil then
    -- A new log (or one written before weights): count what is there.
    total = redis.call('ZCOUNT', KEYS[1], 0, '+inf')
  else
    total = -total
  end
  local expired = redis.call('ZRANGEBYSCORE', KEYS[1], 0, num(from), 'LIMIT', 0, sweep)
  local gone = 0
  for _, m in ipairs(expired) do gone = gone + weight_of(m) end
  local n = math.max(0, total - gone)
  if not peek and #expired > 0 then
    redis.call('ZREM', KEYS[1], unpack(expired))
  end

  local allowed, granted, retry = 0, 0, 0
  if n + cost <= limit then
    allowed = 1
    granted = grant(limit - n - cost)
    n = n + cost + granted
    if not peek then
      local stamp = num(now)
      -- n only grows within one instant, so the member is unique.
      redis.call('ZADD', KEYS[1], stamp, stamp .. '-' .. n .. ':' .. (cost + granted), -n, TOTAL)
      redis.call('PEXPIRE', KEYS[1], math.ceil(window))
    end
  else
    -- Wait until enough of the oldest entries have left the window: walk at
    -- most `sweep` of them; beyond that, a whole window frees everything.
    local need = n + cost - limit
    retry = math.ceil(window)
    local oldest = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. num(from), '+inf', 'WITHSCORES', 'LIMIT', 0, sweep)
    local freed = 0
    for i = 1, #oldest, 2 do
      freed = freed + weight_of(oldest[i])
      if freed >= need then
        retry = math.ceil(tonumber(oldest[i + 1]) + window - now)
        break
      end
    end
    retry = math.max(1, retry)
    if not peek and #expired > 0 then
      redis.call('ZADD', KEYS[1], -n, TOTAL)
    end
  end
  local reset = 0
  local newest = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  if newest[2] and tonumber(newest[2]) > 0 then reset = math.ceil(tonumber(newest[2]) + window - now) end
  return allowed, limit - n, reset, retry, granted
end
