-- GCRA: the theoretical arrival time (tat) of the next conforming request.
-- One token every window/limit ms; capacity tokens of burst. State: tat, and
-- the leased tokens that may still be given back (capped at capacity).
local function decide()
  local interval = window / limit
  local tau = capacity * interval
  local eps = 1e-6
  local tat, lg = load('<dd', 'tat', 'lg')
  tat, lg = tat or now, lg or 0
  if tat < now then tat = now end
  if now >= return_by then returned = 0 end
  if returned > 0 then
    local r = math.min(returned, lg)
    credited = r
    tat, lg = math.max(now, tat - r * interval), lg - r
  end
  if charge then
    local n = math.max(0, math.min(cost, math.floor((now + 2 * tau - tat) / interval + eps)))
    credited = n
    tat = tat + n * interval
    save('<dd', math.max(1000, math.ceil(tat - now + tau)), tat, lg)
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
  end
  if changed(allowed) then
    save('<dd', math.max(1000, math.ceil(tat - now + tau)), tat, lg)
  end
  local remaining = math.max(0, math.floor((now + tau - tat) / interval + eps))
  refund_by = math.floor(tat) -- the bucket is whole again once tat has come
  return allowed, remaining, math.ceil(tat - now), retry, granted
end
