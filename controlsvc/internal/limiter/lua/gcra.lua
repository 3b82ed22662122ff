-- GCRA: the theoretical arrival time (tat) of the next conforming request.
-- One token every window/limit ms; capacity tokens of burst. State: tat, the
-- leased tokens that may still be given back (at most capacity), and when
-- the whole burst was last back (tat reached): a lease's tokens come back
-- only if it has not been since (token_bucket.lua).
local function decide()
  local interval = window / limit
  local tau = capacity * interval
  local eps = 1e-6
  local tat, lg, full = load('<ddd', 'tat', 'lg', 'full')
  tat, lg, full = tat or now, lg or 0, full or 0
  if tat <= now then
    -- Whole again since tat, not since this call saw it; a new counter
    -- since now (token_bucket.lua).
    if fresh then full = now_us else full = math.ceil(tat * 1000) end
    tat, lg = now, 0
  end
  if leased_at < full then returned, release = 0, 0 end
  lg = lg - math.min(release, lg)
  if returned > 0 then
    local r = math.min(returned, lg)
    credited = r
    tat, lg = tat - r * interval, lg - r
    if tat <= now then tat, lg, full = now, 0, now_us end -- whole again (token_bucket.lua)
  end
  window_start = full
  if charge then
    local n = math.max(0, math.min(cost, math.floor((now + tau + debt_floor * interval - tat) / interval + eps)))
    credited = n
    tat = tat + n * interval
    save('<ddd', math.max(1000, math.ceil(tat - now + tau)), tat, lg, full)
    return 1, math.floor((now + tau - tat) / interval + eps), math.ceil(tat - now), 0, 0
  end
  local new_tat = tat + cost * interval
  local needed_tat = tat + admit * interval
  local allowed, granted, retry = 0, 0, 0
  if needed_tat - tau <= now + eps then
    allowed = 1
    granted = grant(math.floor((now + tau - new_tat) / interval + eps))
    tat, lg = new_tat + granted * interval, math.min(capacity, lg + granted)
  else
    retry = math.ceil(needed_tat - tau - now)
    short, in_flight = new_tat - tau <= now + eps, lg
  end
  if changed(allowed) then
    save('<ddd', math.max(1000, math.ceil(tat - now + tau)), tat, lg, full)
  end
  local remaining = math.max(0, math.floor((now + tau - tat) / interval + eps))
  window_end = math.max(now_us + 1, math.floor(tat * 1000)) -- whole again at tat (token_bucket.lua)
  return allowed, remaining, math.ceil(tat - now), retry, granted
end
