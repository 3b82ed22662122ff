-- Token bucket: capacity tokens, refilled at limit per window. State: tokens,
-- the time of the last refill, the leased tokens that may still be given
-- back (at most capacity), and when the bucket was last full: a lease's
-- tokens come back only if it has not been full since they were leased (a
-- hand-back then would come on top of the refill the cap cut: an outsider
-- banked leases on 40 paths, waited, drained the bucket and had them
-- credited, 201 admitted in a burst of 100).
local function decide()
  local rate = limit / window -- tokens per millisecond
  -- The state lives until the bucket is full again: twice the capacity's
  -- refill, longer while a charge's debt is paid.
  local function ttl(tokens)
    return math.max(1000, math.ceil(2 * capacity / rate), math.ceil((capacity - tokens) / rate))
  end
  local tokens, ts, lg, full = load('<dddd', 't', 'ts', 'lg', 'full')
  lg, full = lg or 0, full or 0
  if tokens == nil or ts == nil then
    -- A new counter (or one that expired, full long since): its stretch
    -- starts now, so that no lease of an earlier one comes back into it.
    tokens, ts, full = capacity, now, now_us
  end
  if now > ts then
    -- A clock that moved back (failover to a replica) refills nothing.
    local filled = tokens + (now - ts) * rate
    if filled >= capacity then
      -- Full since the refill reached capacity, not since this call saw
      -- it: a fast bucket's stretch would otherwise start now and end
      -- microseconds later, and two of them in one chain shared no
      -- moment for the lease's stamp (a slow client lost its window's
      -- hand-backs: 81 counted of the 15 it made).
      if tokens < capacity then full = math.ceil((ts + (capacity - tokens) / rate) * 1000) end
      filled, lg = capacity, 0
    end
    tokens, ts = filled, now
  end
  if leased_at < full then returned, release = 0, 0 end
  lg = lg - math.min(release, lg)
  if returned > 0 then
    -- Giving back unspent leased tokens before the bucket was full again
    -- is the same as never taking them; never more than was leased.
    local r = math.min(returned, lg)
    credited = r
    tokens, lg = tokens + r, lg - r
    -- Filled by it, the bucket starts a new stretch as by a refill: what
    -- others leased before would have been cut by the cap now.
    if tokens >= capacity then tokens, lg, full = capacity, 0, now_us end
  end
  window_start = full
  if charge then
    local n = math.max(0, math.min(cost, math.floor(tokens + debt_floor)))
    credited = n
    tokens = tokens - n
    save('<dddd', ttl(tokens), tokens, ts, lg, full)
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
    short, in_flight = tokens >= cost, lg
  end
  if changed(allowed) then
    save('<dddd', ttl(tokens), tokens, ts, lg, full)
  end
  -- The stretch ends when the bucket could first be full again: a stamp
  -- after that might come after it was.
  window_end = now_us + math.max(1, math.floor((capacity - tokens) / rate * 1000))
  return allowed, math.floor(tokens), math.ceil((capacity - tokens) / rate), retry, granted
end
