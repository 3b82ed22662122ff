-- Token bucket: capacity tokens, refilled at limit per window. State is a hash
-- {t = tokens, ts = time of the last refill, lg = leased tokens that may still
-- be given back (capped at capacity)}.
local function decide()
  local rate = limit / window -- tokens per millisecond
  local st = redis.call('HMGET', KEYS[1], 't', 'ts', 'lg')
  local tokens, ts, lg = tonumber(st[1]), tonumber(st[2]), tonumber(st[3]) or 0
  if tokens == nil or ts == nil then
    tokens, ts = capacity, now
  end
  if now > ts then
    -- A clock that moved back (failover to a replica) refills nothing.
    tokens = math.min(capacity, tokens + (now - ts) * rate)
    ts = now
  end
  if returned > 0 then
    -- Giving back unspent leased tokens is the same as never taking them;
    -- never more than was leased.
    local r = math.min(returned, lg)
    credited = r
    tokens, lg = math.min(capacity, tokens + r), lg - r
  end
  local allowed, granted, retry = 0, 0, 0
  if tokens >= cost then
    allowed = 1
    tokens = tokens - cost
    granted = grant(math.floor(tokens))
    tokens, lg = tokens - granted, math.min(capacity, lg + granted)
  else
    retry = math.ceil((cost - tokens) / rate)
  end
  if changed(allowed) then
    redis.call('HSET', KEYS[1], 't', num(tokens), 'ts', num(ts), 'lg', lg)
    redis.call('PEXPIRE', KEYS[1], math.max(1000, math.ceil(2 * capacity / rate)))
  end
  return allowed, math.floor(tokens), math.ceil((capacity - tokens) / rate), retry, granted
end
