-- Token bucket: capacity tokens, refilled at limit per window. State: tokens,
-- the time of the last refill, and the leased tokens that may still be given
-- back (capped at capacity).
local function decide()
  local rate = limit / window -- tokens per millisecond
  local tokens, ts, lg = load('<ddd', 't', 'ts', 'lg')
  lg = lg or 0
  if tokens == nil or ts == nil then
    tokens, ts = capacity, now
  end
  if now > ts then
    -- A clock that moved back (failover to a replica) refills nothing.
    tokens = math.min(capacity, tokens + (now - ts) * rate)
    ts = now
  end
  if now >= return_by then returned = 0 end
  if returned > 0 then
    -- Giving back unspent leased tokens before the bucket was full again
    -- is the same as never taking them; never more than was leased.
    local r = math.min(returned, lg)
    credited = r
    tokens, lg = math.min(capacity, tokens + r), lg - r
  end
  if charge then
    local n = math.max(0, math.min(cost, math.floor(tokens + capacity)))
    credited = n
    tokens = tokens - n
    save('<ddd', math.max(1000, math.ceil(2 * capacity / rate)), tokens, ts, lg)
    return 1, math.floor(tokens), math.ceil((capacity - tokens) / rate), 0, 0
  end
  local allowed, granted, retry = 0, 0, 0
  if tokens >= admit then
    allowed = 1
    tokens = tokens - cost
    granted = grant(math.floor(tokens))
    tokens, lg = tokens - granted, math.min(capacity, lg + granted)
  else
    retry = math.ceil((admit - tokens) / rate)
  end
  if changed(allowed) then
    save('<ddd', math.max(1000, math.ceil(2 * capacity / rate)), tokens, ts, lg)
  end
  refund_by = math.floor(now + (capacity - tokens) / rate)
  return allowed, math.floor(tokens), math.ceil((capacity - tokens) / rate), retry, granted
end
