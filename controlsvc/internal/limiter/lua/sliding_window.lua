-- Sliding window counter: the current window's count plus the previous one's,
-- weighted by how much of it still overlaps the sliding window. State is a hash
-- {w = current window index, c = its count, p = previous count, lg = leased in w}.
local function decide()
  local idx = math.floor(now / window)
  local st = redis.call('HMGET', KEYS[1], 'w', 'c', 'p', 'lg')
  local w = tonumber(st[1])
  local c, p, lg = tonumber(st[2]) or 0, tonumber(st[3]) or 0, tonumber(st[4]) or 0
  if w == nil or idx > w + 1 then
    c, p, lg = 0, 0, 0
  elseif idx == w + 1 then
    c, p, lg = 0, c, 0
  elseif idx < w then
    idx = w
  end
  if returned > 0 then
    local r = math.min(returned, lg)
    credited = r
    c, lg = c - r, lg - r
  end
  local elapsed = math.max(0, now - idx * window)
  local weight = math.max(0, 1 - elapsed / window)
  local est = p * weight + c
  local allowed, granted, retry = 0, 0, 0
  if est + cost <= limit then
    allowed = 1
    c = c + cost
    granted = grant(math.floor(limit - (p * weight + c)))
    c, lg = c + granted, lg + granted
  else
    local need = est + cost - limit
    if p * weight >= need then
      -- The previous window's weight fades at p/window per millisecond.
      retry = math.ceil(need * window / p)
    else
      -- Not before the next window, where c becomes the fading part.
      retry = math.ceil(window - elapsed)
      if c > 0 and c > limit - cost then
        retry = retry + math.ceil(window * (1 - (limit - cost) / c))
      end
    end
  end
  if changed(allowed) then
    redis.call('HSET', KEYS[1], 'w', idx, 'c', c, 'p', p, 'lg', lg)
    redis.call('PEXPIRE', KEYS[1], math.ceil(2 * window))
  end
  local remaining = math.max(0, math.floor(limit - (p * weight + c)))
  return allowed, remaining, math.max(1, math.ceil(window - elapsed)), math.max(retry, allowed == 1 and 0 or 1), granted
end
