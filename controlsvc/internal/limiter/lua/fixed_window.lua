-- Fixed window: a counter per window index. State: the window index, the
-- count, and the tokens leased in this window (the most that may be given back).
-- ARGV[13], when sent, is a calendar period's start (ms): the window is that
-- period, in a counter of its own, always index 0: the service chose the
-- period by its clock, and Redis's clock on either side of the boundary
-- never opens a second window in it (that would be a second quota).
local origin = tonumber(ARGV[13] or '0')
local function decide()
  local idx = math.floor(now / window)
  if origin > 0 then idx = 0 end
  local w, c, lg = load('<ddd', 'w', 'c', 'lg')
  c, lg = c or 0, lg or 0
  if w == nil then
    c, lg = 0, 0
  elseif idx > w then
    -- A charge's debt (a count past the limit) is carried: each window
    -- that passed paid a limit of it.
    c, lg = math.max(0, c - limit * (idx - w)), 0
  elseif idx < w then
    idx = w -- the clock moved back: stay in the stored window, never reopen an old one
  end
  window_start = (idx * window + origin) * 1000
  window_end = window_start + window * 1000
  if leased_at < window_start or leased_at >= window_end then returned, release = 0, 0 end
  -- What a charge settles leaves first, then what it hands back comes out
  -- of the rest, as in every script (a claim past what is held credits
  -- the less).
  lg = lg - math.min(release, lg)
  if returned > 0 then
    local r = math.min(returned, lg)
    credited = r
    c, lg = c - r, lg - r
  end
  local reset = math.max(1, math.ceil((idx + 1) * window + origin - now))
  -- The count lives through this window and the next, and while a debt
  -- is paid one window a limit. A calendar period's counter is its
  -- period's alone: the next period starts afresh, debt or none.
  local function ttl(c)
    if origin > 0 then return math.ceil(reset + window) end
    return math.ceil(reset + window * (1 + math.max(0, math.ceil(c / limit) - 1)))
  end
  if charge then
    local n = math.max(0, math.min(cost, limit + debt_floor - c))
    credited = n
    c = c + n
    save('<ddd', ttl(c), idx, c, lg)
    return 1, limit - c, reset, 0, 0
  end
  local allowed, granted, retry = 0, 0, 0
  if c + admit <= limit then
    allowed = 1
    c = c + cost
    granted = grant(limit - c)
    c, lg = c + granted, lg + granted
  else
    -- In debt, the windows that pay it first (c carried, a limit less
    -- each); a calendar period's next period starts afresh (told to
    -- come back in days of debt, a caller was refused nothing after
    -- midnight: attack 56 F5).
    retry = reset
    short, in_flight = c + cost <= limit, lg
    if origin == 0 then
      retry = reset + window * math.max(0, math.ceil((c + admit - limit) / limit) - 1)
    end
  end
  if changed(allowed) then
    save('<ddd', ttl(c), idx, c, lg)
  end
  return allowed, limit - c, reset, retry, granted
end
