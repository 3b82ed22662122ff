-- Shared head of every limiter script. The algorithm file that follows defines
-- decide(); epilogue.lua calls it. Together they form one atomic script.
--
-- KEYS[1] counter, KEYS[2] violations (ZSET), KEYS[3] penalty block; all three
-- share the owner's hash tag, so the script is cluster-safe.
-- ARGV: 1 limit, 2 window_ms, 3 capacity, 4 cost, 5 lease wanted, 6 lease
-- returned, 7 lease fraction, 8 mode (1 = peek: read only; 2 = lease only
-- from a counter already in use; 3 = charge: spend the cost whatever is
-- left, down to a balance of -max_debt capacities at most, and return in the last
-- slot what was spent; 4 = a charge of a counter other callers share, its
-- floor minus one window's limit (debt_floor); 0 = none of these), 9 penalties on,
-- 10 penalty window_ms, 11 threshold, 12 multipliers "1,2,4,8". Without
-- penalties only KEYS[1] and ARGV 1..8 are sent. ARGV[13] is a calendar
-- period's start (fixed_window.lua); ARGV[14], when sent, is what must be
-- left to admit (an estimate of a cost known after the response), when
-- more than the cost spent now. ARGV[15], when sent, is the leased_at of
-- the lease that `returned` hands back (below). ARGV[16], when sent, is
-- what an admission holds beyond its cost (below).
-- Returns {allowed, remaining, reset_ms, retry_ms, granted, penalized,
-- credited, window_start, window_end, reserved}.
if redis.replicate_commands then redis.replicate_commands() end

local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local capacity = tonumber(ARGV[3])
local cost = tonumber(ARGV[4])
-- admit is what must be left for the request to pass; cost is what it
-- spends (less than admit only for an estimated cost).
local admit = math.max(cost, tonumber(ARGV[14] or '0'))
local want = tonumber(ARGV[5])
local returned = tonumber(ARGV[6])
-- A counter takes back a lease's tokens (returned) only into the stretch
-- of time they came from: a window into its window, a bucket only if it
-- has not been full again since (its stretch runs from the moment it was
-- last full). ARGV[15] is the lease's leased_at, a moment (microseconds,
-- Redis's clock) inside the stretch of every counter that granted it as it
-- was then (window_start and window_end below: the latest of the starts,
-- before the earliest of the ends), which the service sent with the lease
-- and the filter sends back with the tokens; without it, none.
-- Tokens of a stretch that has ended came off its leases, and credited
-- against the next one's they would take from leases other buckets of the
-- counter were granted there (a tier's total across paths, an LLM pool:
-- outsiders admitted 328 in a window of 200; on a bucket refilled and
-- drained, 201 in a burst of 100). One deadline for all the lease's
-- counters (the earliest end) took every hand-back from a long window
-- beside a short one or a fast bucket: a slow client got 29 of its 100.
local leased_at = tonumber(ARGV[15] or '0')
-- window_start and window_end bound the counter's stretch for a lease
-- granted now (microseconds, this server's clock), set by decide(): a
-- window's own bounds; a bucket's from when it was last full to when it
-- could first be full again (a later stamp could come after it was). What
-- the service makes leased_at of.
local window_start, window_end = 0, 0
-- reserve is what an admission holds beyond its cost until the response
-- is charged (a token budget's reserve: the most a request can cost), so
-- that a caller cannot have more in flight than it has left. It is taken
-- with the lease (grant), whole when admit asked for it to be left, and
-- counted among the tokens leased, so that the charge hands back what the
-- response did not use into the stretch it came from (returned, leased_at:
-- the window's start), as a lease's unspent tokens are. reserved is what
-- was taken.
local reserve = tonumber(ARGV[16] or '0')
local reserved = 0
-- short is set by a refusal that the cost alone would have passed: the
-- reserve (or estimate) is what is not left. Under a reserve that is the
-- caller's own requests in flight, whose charges may soon hand some back:
-- no violation for progressive penalties (an honest client with five
-- requests at once was blocked for 64 s, and longer with each refusal,
-- with 750 of its 1,000 tokens left: attack 58 F4).
local short = false
-- ARGV[17], when sent, is what a charge settles of a held reserve without
-- handing it back (the part its response used): it leaves the tokens held
-- of the stretch leased_at names (lg), as the part handed back does, so
-- that they count only reserves still in flight. in_flight is what the
-- counter's stretch holds so, read by a refusal short of the reserve: its
-- retry_after is then a second at most, as a charge may hand some back at
-- any moment (told the window's end, an honest client with its own
-- requests in flight waited 56 s with 750 of its 1,000 tokens left:
-- attack 59 N3).
local release = tonumber(ARGV[17] or '0')
local in_flight = 0
local fraction = tonumber(ARGV[7])
local peek = ARGV[8] == '1'
local warm_only = ARGV[8] == '2'
-- A charge is a cost known after the response (LLM tokens): the request was
-- admitted already, so it is spent whatever is left, taking the balance
-- below zero (the caller is refused until it refills), but never below
-- -max_debt capacities (below).
local charge = ARGV[8] == '3' or ARGV[8] == '4'
-- credited is what a refund really gave back: at most what is still
-- leased, whatever the caller claimed (usage subtracts this, not the claim).
local credited = 0
-- A charge takes a counter down to minus max_debt capacities at most, and
-- the debt is paid as the counter refills, a window's limit a window: a
-- token budget's caller who asks for a completion fifty times its budget
-- owes fifty windows. Stopped at minus one capacity, and a fixed window
-- forgetting its debt when it rolled, one large completion a window was
-- charged the budget once (an outsider's 400,400 tokens in 131 s against
-- 2,000 a minute). The bound keeps an upstream that reports an absurd
-- usage from locking its caller out for good. A counter other callers
-- share (a global, endpoint, tenant or address budget) goes to minus one
-- window's limit only, whatever its burst: one caller's answer would
-- otherwise refuse everyone for a hundred windows (an outsider's one
-- answer of a million tokens against a global 2,000 a minute: every other
-- caller told to come back in 101 minutes; a JWT user's, every user behind
-- its address), or for a burst's refill (30 s of a bucket of 100 a second
-- with a burst of 3,000). debt_floor is that bound, in tokens.
local max_debt = 100
local debt_floor = max_debt * capacity
if ARGV[8] == '4' then debt_floor = limit end

-- All time comes from the Redis server, in milliseconds with microsecond
-- fractions: never a client's or a replica's clock.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
-- The same in whole microseconds (exact in a double until 2255): a lease's
-- stamp must tell apart two calls of one millisecond.
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])

-- Times in milliseconds that reach Redis (a TTL, a block) or the caller are
-- whole numbers of at most MAX_MS (about 139 years: a Go time.Duration holds
-- 292). The accepted ranges
-- allow a burst of 2^53 refilled at 1 an hour: a refill time of 10^19 ms,
-- which SET PX refuses (the script would fail, and a failing script counts
-- as Redis down, switching limiting off for everyone).
local MAX_MS = 2^42
local function ms(x) return math.min(math.max(1, math.ceil(x)), MAX_MS) end

-- Numbers are written with full precision: redis.call would format them with
-- 14 significant digits, which loses milliseconds of a Unix time.
local function num(x) return string.format('%.17g', x) end

-- fresh is true when the counter held no state before this call (its
-- algorithm's load, or meta for the sliding log, says so).
local fresh = false

-- grant is the lease: at most what was wanted, never more than a fraction of
-- what is left, so near the limit every request comes back to Redis. In
-- mode 2 a fresh counter grants none: the lease is one of several counters'
-- (a path's and a tier's total across paths), and tokens leased to a path
-- asked for once (a client walking ids) would sit unspent in the filter
-- while the shared counter they also came out of ran dry. A path that
-- comes back gets its lease on the second call.
local function grant(avail)
  if avail <= 0 or peek or charge then return 0 end
  reserved = math.min(reserve, math.floor(avail))
  avail = avail - reserved
  if want <= 0 or avail <= 0 or (warm_only and fresh) then return reserved end
  local g = math.floor(avail * fraction)
  if g > want then g = want end
  return g + reserved
end

-- A counter's state is one string of packed doubles (struct.pack): a GET
-- and a SET PX per call where a hash took HMGET, HSET and PEXPIRE, a fifth
-- less Redis CPU per script call (measured), and half the memory per key.
-- Doubles hold the integers and the fractional times exactly.
--
-- load returns the state's numbers in the order of fmt ('<ddd': little-endian
-- whatever the server), or nothing
-- for a counter not yet stored. A counter an earlier version stored as a
-- hash is read as one, by its field names (...), and the next write
-- replaces it: an upgrade is seamless.
local function load(fmt, ...)
  local v = redis.pcall('GET', KEYS[1])
  if type(v) == 'string' then
    -- A state an earlier version stored with fewer numbers reads the
    -- missing ones as 0 (anything else that does not fit is damage: the
    -- script fails, for this counter alone).
    local size = struct.size(fmt)
    if #v < size and #v % 8 == 0 then v = v .. string.rep('\0', size - #v) end
    return struct.unpack(fmt, v)
  end
  if type(v) == 'table' and v.err then
    local st = redis.call('HMGET', KEYS[1], ...)
    local n = select('#', ...)
    for i = 1, n do st[i] = tonumber(st[i]) end
    return unpack(st, 1, n)
  end
  fresh = true
end

-- save stores the state (fmt as for load) for ttl milliseconds.
local function save(fmt, ttl, ...)
  redis.call('SET', KEYS[1], struct.pack(fmt, ...), 'PX', ms(ttl))
end

-- changed reports whether a decision must be written back: a denial
-- without a refund spends nothing, and what it computed (a refill, a new
-- window) the next call computes again from the same stored state, so it
-- writes nothing (two commands fewer: a flood of denials is cheaper than
-- the traffic it replaces). The stored TTL still covers that state.
local function changed(allowed)
  return not peek and (allowed == 1 or returned > 0 or release > 0)
end
