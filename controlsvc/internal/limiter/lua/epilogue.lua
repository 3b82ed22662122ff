-- Shared tail: penalty block, the algorithm's decision, violations.
local pen = ARGV[9] == '1' and not peek

if pen then
  local blocked = redis.call('PTTL', KEYS[3])
  if blocked > 0 then
    return {0, 0, blocked, blocked, 0, 1, 0, 0, 0, 0}
  end
end

local allowed, remaining, reset, retry, granted = decide()
local penalized = 0

if allowed == 0 and pen and not (short and reserve > 0) then
  -- Progressive penalty: remember the violation; from the threshold on, the
  -- wait is multiplied and enforced by a block key that expires with it.
  -- The work is bounded whatever the log holds: at most `keep` entries (the
  -- config bounds the threshold by it), expired ones removed at most
  -- `sweep` per violation (ZREMRANGEBYSCORE could remove a whole log at
  -- once), and the live ones counted, not listed.
  local keep, sweep = 1000, 16
  local pwin = tonumber(ARGV[10])
  local from = num(now - pwin)
  local stale = redis.call('ZCOUNT', KEYS[2], '-inf', from)
  if stale > 0 then
    redis.call('ZREMRANGEBYRANK', KEYS[2], 0, math.min(stale, sweep) - 1)
  end
  local n = redis.call('ZCOUNT', KEYS[2], '(' .. from, '+inf') + 1
  -- The log's size makes the member unique within one instant.
  local size = redis.call('ZCARD', KEYS[2])
  redis.call('ZADD', KEYS[2], num(now), num(now) .. '-' .. size)
  if size + 1 > keep then
    -- Oldest first: expired entries go before live ones.
    redis.call('ZREMRANGEBYRANK', KEYS[2], 0, size - keep)
  end
  n = math.min(n, keep)
  redis.call('PEXPIRE', KEYS[2], math.ceil(pwin))
  local threshold = tonumber(ARGV[11])
  if n >= threshold then
    local mults = {}
    for m in string.gmatch(ARGV[12], '[^,]+') do mults[#mults + 1] = tonumber(m) end
    local m = mults[math.min(n - threshold + 1, #mults)] or 1
    if m > 1 then
      retry = ms(math.max(retry, 1) * m)
      redis.call('SET', KEYS[3], '1', 'PX', retry)
      penalized = 1
    end
  end
end

if short and reserve > 0 and in_flight > 0 then retry = math.min(retry, 1000) end
if retry > 0 then retry = ms(retry) end
-- The lease is what was granted beyond the reservation.
return {allowed, remaining, ms(reset), retry, granted - reserved, penalized, credited, window_start, window_end, reserved}
