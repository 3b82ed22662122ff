-- Sliding window counter: the current window's count plus the previous one's,
-- weighted by how much of it still overlaps the sliding window. State: the
-- current window index, its count, the previous count, what was leased in
-- the current window, and what the previous window leased and was not
-- handed back.
local function decide()
  local idx = math.floor(now / window)
  local w, c, p, lg, lgp = load('<ddddd', 'w', 'c', 'p', 'lg', 'lgp')
  c, p, lg, lgp = c or 0, p or 0, lg or 0, lgp or 0
  if w == nil then
    c, p, lg, lgp = 0, 0, 0, 0
  elseif idx > w then
    -- A charge's debt (a count past the limit) is carried: each window
    -- that passed paid a limit of it, and the window before this one
    -- weighs at most a limit.
    local g = idx - w
    if g == 1 then lgp = lg else lgp = 0 end
    c, p, lg = math.max(0, c - limit * g), math.min(limit, math.max(0, c - limit * (g - 1))), 0
  elseif idx < w then
    idx = w
  end
  window_start = idx * window * 1000
  window_end = window_start + window * 1000
  -- What a charge settles leaves first, then what it hands back comes out
  -- of the rest, in the window the stamp names.
  if leased_at >= window_start and leased_at < window_end then
    lg = lg - math.min(release, lg)
    local r = math.min(returned, lg)
    credited = r
    c, lg = c - r, lg - r
  elseif leased_at >= window_start - window * 1000 and leased_at < window_start then
    -- The previous window's tokens still weigh in the sliding window
    -- through its count: handed back, they come off it (kept, they took
    -- a client's next window: an outsider's 40 requests with leases left
    -- it 29 of its 200 where 161 came without leases).
    lgp = lgp - math.min(release, lgp)
    local r = math.min(returned, lgp)
    credited = r
    p, lgp = p - r, lgp - r
  else
    returned, release = 0, 0
  end
  -- The counts live two windows, and while a debt is paid one window a
  -- limit.
  local function ttl(c)
    return math.ceil(window * (2 + math.max(0, math.ceil(c / limit) - 1)))
  end
  local elapsed = math.max(0, now - idx * window)
  local weight = math.max(0, 1 - elapsed / window)
  local est = p * weight + c
  if charge then
    local n = math.max(0, math.min(cost, math.floor(limit + debt_floor - est)))
    credited = n
    c = c + n
    save('<ddddd', ttl(c), idx, c, p, lg, lgp)
    return 1, math.floor(limit - (est + n)), math.max(1, math.ceil(window - elapsed)), 0, 0
  end
  local allowed, granted, retry = 0, 0, 0
  if est + admit <= limit then
    allowed = 1
    c = c + cost
    granted = grant(math.floor(limit - (p * weight + c)))
    c, lg = c + granted, lg + granted
  else
    short, in_flight = est + cost <= limit, lg + lgp
    local need = est + admit - limit
    if p * weight >= need then
      -- The previous window's weight fades at p/window per millisecond.
      retry = math.ceil(need * window / p)
    else
      -- Not in this window: in the first window g ahead whose own count
      -- leaves room (c carried a limit less a window, as a new window
      -- carries it), once the window before it, which weighs at most a
      -- limit, has faded enough. Counted by whole windows of debt, the
      -- wait came out up to half a window long (attack 55, Info).
      local g = math.max(1, math.ceil((c + admit - limit) / limit))
      local cg = math.max(0, c - limit * g)
      local pg = math.min(limit, math.max(0, c - limit * (g - 1)))
      retry = math.ceil(window - elapsed) + window * (g - 1)
      if pg > 0 then
        retry = retry + math.max(0, math.ceil(window * (1 - (limit - admit - cg) / pg)))
      end
    end
  end
  if changed(allowed) then
    save('<ddddd', ttl(c), idx, c, p, lg, lgp)
  end
  local remaining = math.max(0, math.floor(limit - (p * weight + c)))
  return allowed, remaining, math.max(1, math.ceil(window - elapsed)), math.max(retry, allowed == 1 and 0 or 1), granted
end
