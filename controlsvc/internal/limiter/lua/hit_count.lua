-- A fixed-window hit counter with envoyproxy/ratelimit's semantics, for the
-- rate limit service protocol: every hit is counted, refused or not (the
-- peer's INCRBY), and the window is aligned to the Unix epoch (the peer's
-- now / unit * unit), clocked by this Redis server.
--
-- KEYS[1] the counter. ARGV[1] hits (0 reads), ARGV[2] window in seconds.
-- State: one string of two packed doubles, the window index and the count.
-- Returns {count after the hits, seconds until the window ends}.
local hits = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1])
local idx = math.floor(now / window)
local c = 0
local v = redis.call('GET', KEYS[1])
if v then
  local w, n = struct.unpack('<dd', v)
  if w == idx then
    c = n
  elseif w > idx then
    idx, c = w, n -- the clock moved back: stay in the stored window
  end
end
local reset = (idx + 1) * window - now
if hits > 0 then
  c = c + hits
  redis.call('SET', KEYS[1], struct.pack('<dd', idx, c), 'EX', math.max(1, reset))
end
return {c, reset}
