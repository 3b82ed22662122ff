// Package limiter runs Tollgate's rate-limit algorithms as atomic Redis Lua
// scripts. Each script decides, spends the cost, grants a lease and records
// penalty violations in one step, clocked by the Redis server's TIME.
package limiter

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-rl/tollgate/controlsvc/internal/keys"
	"github.com/tollgate-rl/tollgate/shared/identity"
	"github.com/tollgate-rl/tollgate/shared/rules"
)

//go:embed lua/*.lua
var luaFiles embed.FS

// Client is the part of a Redis client the limiter needs. A single client, a
// sentinel-backed client and a cluster client all satisfy it.
type Client interface {
	redis.Scripter
	Process(ctx context.Context, cmd redis.Cmder) error
	Unlink(ctx context.Context, keys ...string) *redis.IntCmd
	Ping(ctx context.Context) *redis.StatusCmd
	Pipelined(ctx context.Context, fn func(redis.Pipeliner) error) ([]redis.Cmder, error)
}

// Penalty is the progressive penalty policy: from the Threshold-th violation
// within Window on, the wait of a denial is multiplied by the next entry of
// Multipliers (the last one repeats) and enforced.
type Penalty struct {
	Window      time.Duration
	Threshold   int64
	Multipliers []int64
}

// Request is one call to a counter: Rule's counter of Owner. The limiter
// builds every key it touches from these (the counter, and the owner's
// penalty and block records).
type Request struct {
	Owner keys.Owner
	// Rule gives the algorithm, the limit, the window, the capacity (the
	// bucket size of token_bucket and gcra; the window algorithms ignore it)
	// and the counter's name.
	Rule *rules.Rule
	// Endpoint is the normalised path; it names the counter only when the
	// rule counts per endpoint.
	Endpoint string
	// Cost is what this request spends; 0 reads the counter without spending.
	Cost int64
	// Lease is how many extra tokens to take for the caller's local cache;
	// Returned gives back unspent tokens of an earlier lease.
	Lease    int64
	Returned int64
	// LeasedAt is the leased_at of the lease Returned comes from: the
	// counter credits the hand-back only when it falls in its current
	// stretch (a window; a bucket's time since it was last full:
	// prelude.lua), nothing without it.
	LeasedAt int64
	// LeaseFraction caps a lease at this share of what is left.
	LeaseFraction float64
	// Peek reads without writing anything (status queries).
	Peek bool
	// WarmLeaseOnly grants a lease only from a counter that was already in
	// use: set when the lease is one of several rules' (see prelude.lua).
	WarmLeaseOnly bool
	// Penalty is nil when progressive penalties are off.
	Penalty *Penalty
	// Admit, when more than Cost, is what must be left for the request to
	// pass (an estimate of a cost known after the response); Cost is still
	// what it spends.
	Admit int64
	// Charge spends Cost whatever is left (a cost known after the response
	// of a request already admitted), down to a balance of minus a hundred
	// capacities at most, or minus one window's limit on a counter other
	// callers share (ManyCallers; prelude.lua's debt_floor); Result.Charged
	// says what was spent. No lease, no
	// refund, no penalty goes with it.
	Charge bool
	// Reserve is what an admission holds beyond Cost until its response
	// is charged (a rule's reserve less the admission's cost; Admit should
	// ask for both to be left): taken whole when that much is left, with
	// the lease, and given back as a lease's tokens are (Result.Reserved).
	Reserve int64
	// Release is what a settled reserve's charge or hand-back takes off
	// the counter's tokens held without handing it back (what the response
	// used), in the stretch LeasedAt names: held tokens then count only
	// reserves still in flight, which a refusal short of the reserve
	// reads for its retry_after (prelude.lua).
	Release int64
	// Origin is the start of a calendar period (Unix ms; 0: none): the
	// rule's window is then that period's length, counted from Origin
	// (fixed_window only), in a counter of its own.
	Origin int64
}

// Key is the request's counter. The counter of a limit a check names itself
// (rule id "request") leaves its window out of its name: the caller picks the
// window, and Reset must find the counter whatever window was picked.
func (r *Request) Key() string {
	ep := ""
	if r.Rule.CountsPerEndpoint() {
		ep = r.Endpoint
	}
	window := r.Rule.WindowSeconds
	switch {
	case r.Rule.ID == rules.IDRequest:
		window = 0
	case r.Origin > 0:
		// One counter per period, named for its start: a day's length
		// varies with daylight saving, a month's with the month.
		window = r.Origin / 1000
	}
	return keys.Counter(r.Owner, r.Rule.ID, ep, string(r.Rule.Algorithm), window)
}

// Owner is the owner of rule r's counters for a caller: what the rule's scope
// counts (the identity, its address, its tenant, everyone).
func Owner(r *rules.Rule, id identity.ID, tenant string) keys.Owner {
	return keys.NewOwner(string(r.Scope), rules.Subject(r.Scope, id.String(), id.Value, tenant))
}

// Result is a counter's answer.
type Result struct {
	// Allowed is true when the cost was spent.
	Allowed bool
	// Remaining is what is left after the cost and the lease, floored.
	Remaining int64
	// ResetAfter is when the counter is whole again (window algorithms: the
	// end of the current window).
	ResetAfter time.Duration
	// RetryAfter is 0 when allowed, else the wait before the same request can
	// pass (longer under a penalty).
	RetryAfter time.Duration
	// Granted is the lease: tokens already spent in Redis on the caller's behalf.
	Granted int64
	// Reserved is what the admission holds beyond its cost
	// (Request.Reserve), counted among the leased tokens: a hand-back
	// with the stretch's stamp (WindowStart) returns it.
	Reserved int64
	// Penalized is true when a progressive penalty lengthened or caused the
	// denial.
	Penalized bool
	// Credited is what the request's Returned really gave back: never more
	// than the counter still had leased.
	Credited int64
	// Charged is what a Charge spent: its cost, less what would have taken
	// the balance below its floor (Charge).
	Charged int64
	// WindowStart and WindowEnd bound the counter's stretch for a lease
	// granted now, in Unix microseconds on the Redis server's clock (0 for
	// the sliding log): a window's bounds; a bucket's from when it was
	// last full to when it could first be full again. What a lease's
	// leased_at is made of (Request.LeasedAt).
	WindowStart, WindowEnd int64
}

// Limiter runs the scripts against one Redis client.
type Limiter struct {
	rdb     Client
	scripts map[rules.Algorithm]*script
	// hitCount is the rate limit service's fixed window (Count).
	hitCount *script
	batch    *batcher
	// lastFraction is the lease fraction last sent (fraction).
	lastFraction atomic.Pointer[fractionArg]
}

// New loads the embedded scripts. It does not talk to Redis; scripts are sent
// with EVALSHA and loaded on the first NOSCRIPT.
func New(rdb Client) (*Limiter, error) {
	prelude, err := luaFiles.ReadFile("lua/prelude.lua")
	if err != nil {
		return nil, fmt.Errorf("read prelude: %w", err)
	}
	epilogue, err := luaFiles.ReadFile("lua/epilogue.lua")
	if err != nil {
		return nil, fmt.Errorf("read epilogue: %w", err)
	}
	l := &Limiter{rdb: rdb, scripts: make(map[rules.Algorithm]*script, len(rules.Algorithms)), batch: newBatcher(rdb)}
	for _, a := range rules.Algorithms {
		body, err := luaFiles.ReadFile("lua/" + string(a) + ".lua")
		if err != nil {
			return nil, fmt.Errorf("read script %s: %w", a, err)
		}
		l.scripts[a] = newScript(string(prelude) + "\n" + string(body) + "\n" + string(epilogue))
	}
	if l.hitCount, err = newHitCountScript(); err != nil {
		return nil, err
	}
	return l, nil
}

// ScriptHash returns the SHA1 an algorithm's script runs under with EVALSHA
// (for benchmarks that drive it with redis-benchmark after Load).
func (l *Limiter) ScriptHash(a rules.Algorithm) (hash string, ok bool) {
	s, ok := l.scripts[a]
	if !ok {
		return "", false
	}
	return s.Hash(), true
}

// Load sends every script to Redis ahead of the first request.
func (l *Limiter) Load(ctx context.Context) error {
	for a, s := range l.scripts {
		if err := s.Load(ctx, l.rdb).Err(); err != nil {
			return fmt.Errorf("load script %s: %w", a, err)
		}
	}
	if err := l.hitCount.Load(ctx, l.rdb).Err(); err != nil {
		return fmt.Errorf("load hit count script: %w", err)
	}
	return nil
}

// ErrBadRequest is wrapped by errors about the request itself, not Redis.
var ErrBadRequest = errors.New("bad limiter request")

// ErrScript is wrapped by an error a script raised itself while Redis
// answered: a fault of the script or of what it was given, never a sign
// that Redis is down (so it must not open a circuit breaker or switch on
// the failure mode for everyone).
var ErrScript = errors.New("limiter script failed")

// scriptError tells a script's own error (an error reply naming the
// script) from a failure to reach Redis.
func scriptError(err error) bool {
	var re redis.Error
	if !errors.As(err, &re) {
		return false
	}
	msg := re.Error()
	return strings.HasPrefix(msg, "ERR ") && (strings.Contains(msg, "script: ") || strings.Contains(msg, "user_script:"))
}

// Do runs one counter.
func (l *Limiter) Do(ctx context.Context, r Request) (Result, error) {
	s, argv, err := l.prepare(&r)
	if err != nil {
		return Result{}, err
	}
	var v any
	if r.Peek {
		// A read-only script may run on a replica; leave that choice to the
		// client (EVALSHA_RO).
		argv[0] = "evalsha_ro"
		v, err = s.run(ctx, l.rdb, argv)
	} else {
		v, err = l.batch.run(ctx, s, argv)
	}
	return scriptResult(r.Rule, r.Charge, v, err)
}

// PendingDo is a queued Do.
type PendingDo struct {
	rule   *rules.Rule
	charge bool
	c      *call
	done   *Result // decided already (Decided)
}

// Decided is a Do decided without Redis (memlimit), for callers that take a
// PendingDo.
func Decided(r Result) *PendingDo { return &PendingDo{done: &r} }

// DoAsync queues a Do (not a Peek) and returns at once; calls queued one
// after another run in Redis in that order.
func (l *Limiter) DoAsync(ctx context.Context, r Request) (*PendingDo, error) {
	if r.Peek {
		return nil, fmt.Errorf("%w: a peek is not queued", ErrBadRequest)
	}
	s, argv, err := l.prepare(&r)
	if err != nil {
		return nil, err
	}
	c, err := l.batch.enqueue(ctx, s, argv)
	if err != nil {
		return nil, fmt.Errorf("queue %s script: %w", r.Rule.Algorithm, err)
	}
	return &PendingDo{rule: r.Rule, charge: r.Charge, c: c}, nil
}

// Wait returns the counter's answer.
func (p *PendingDo) Wait(ctx context.Context) (Result, error) {
	if p.done != nil {
		return *p.done, nil
	}
	v, err := p.c.wait(ctx)
	return scriptResult(p.rule, p.charge, v, err)
}

// prepare checks a request and builds its script call: the EVALSHA
// command, its keys and arguments in one slice.
func (l *Limiter) prepare(r *Request) (*script, []any, error) {
	q := r.Rule
	if q == nil {
		return nil, nil, fmt.Errorf("%w: no rule", ErrBadRequest)
	}
	s, ok := l.scripts[q.Algorithm]
	if !ok {
		return nil, nil, fmt.Errorf("%w: unknown algorithm %q", ErrBadRequest, q.Algorithm)
	}
	if q.Limit <= 0 || q.WindowSeconds <= 0 || r.Cost < 0 || r.Lease < 0 || r.Returned < 0 || r.Reserve < 0 || r.Release < 0 {
		return nil, nil, fmt.Errorf("%w: limit, window, cost, lease, returned, reserve and release must be positive", ErrBadRequest)
	}
	if r.Release > 0 && r.LeasedAt <= 0 {
		return nil, nil, fmt.Errorf("%w: a release names its stretch (leased_at)", ErrBadRequest)
	}
	if r.Charge && (r.Peek || r.Lease > 0 || r.Returned > 0 || r.Reserve > 0 || r.Penalty != nil || q.Algorithm == rules.SlidingLog) {
		return nil, nil, fmt.Errorf("%w: a charge takes no peek, lease, refund, reserve or penalty, and no sliding log", ErrBadRequest)
	}
	if r.Reserve > 0 && (r.Peek || q.Algorithm == rules.SlidingLog) {
		return nil, nil, fmt.Errorf("%w: a reserve is held by no peek and no sliding log", ErrBadRequest)
	}
	// Without penalties the script is sent only what it reads: the counter
	// and eight arguments (ARGV[9] absent is "off"). Each key and argument
	// costs Redis a conversion per call.
	var args []any
	if r.Penalty != nil {
		args = append(s.evalSha(3, 3+17), r.Key(), keys.Penalty(r.Owner), keys.Block(r.Owner))
	} else {
		args = append(s.evalSha(1, 1+17), r.Key())
	}
	args = append(args,
		q.Limit,
		q.WindowSeconds*1000,
		q.Capacity(),
		r.Cost,
		r.Lease,
		r.Returned,
		l.fraction(r.LeaseFraction),
		mode(r),
	)
	if p := r.Penalty; p != nil {
		args = append(args, "1", p.Window.Milliseconds(), p.Threshold, joinInts(p.Multipliers))
	}
	// The optional arguments are positional: one sent needs those before it.
	last := 12
	switch {
	case r.Release > 0:
		last = 17
	case r.Reserve > 0:
		last = 16
	case r.Returned > 0 && r.LeasedAt > 0:
		last = 15
	case r.Admit > r.Cost:
		last = 14
	case r.Origin > 0:
		last = 13
	}
	if last > 12 && r.Penalty == nil {
		args = append(args, "0", 0, 0, "")
	}
	if last >= 13 {
		args = append(args, r.Origin) // ARGV[13]
	}
	if last >= 14 {
		args = append(args, r.Admit) // ARGV[14]: the script takes the larger of it and the cost
	}
	if last >= 15 {
		args = append(args, r.LeasedAt) // ARGV[15]
	}
	if last >= 16 {
		args = append(args, r.Reserve) // ARGV[16]
	}
	if last >= 17 {
		args = append(args, r.Release) // ARGV[17]
	}
	return s, args, nil
}

// scriptResult reads a limiter script's answer.
func scriptResult(q *rules.Rule, charge bool, v any, err error) (Result, error) {
	if err != nil && scriptError(err) {
		return Result{}, fmt.Errorf("%w: %s script of rule %s: %w", ErrScript, q.Algorithm, q.ID, err)
	}
	if err != nil {
		return Result{}, fmt.Errorf("run %s script: %w", q.Algorithm, err)
	}
	res, err := parseResult(v)
	if charge {
		// A charge's last slot is what it spent (it credits nothing).
		res.Charged, res.Credited = res.Credited, 0
	}
	return res, err
}

// fraction is ARGV[7], the lease fraction as Redis reads it. A service
// sends one fraction (its configuration's), so the last one is kept
// formatted and boxed: two allocations less per call.
func (l *Limiter) fraction(f float64) any {
	if last := l.lastFraction.Load(); last != nil && last.f == f {
		return last.arg
	}
	a := &fractionArg{f: f, arg: strconv.FormatFloat(f, 'f', -1, 64)}
	l.lastFraction.Store(a)
	return a.arg
}

type fractionArg struct {
	f   float64
	arg any
}

// ManyCallers says a scope's counter counts other callers than the one
// charged: those every caller shares (global, endpoint, tenant), and an
// address's, which counts every user and key behind it (an office's NAT,
// a proxy). A charge takes such a counter down one window's limit at most:
// one caller's debt is everyone's there.
func ManyCallers(s rules.Scope) bool { return s.Shared() || s == rules.ScopeIP }

// mode is ARGV[8]: what the script may write and grant. It answers a
// boxed constant: a string boxed at run time is an allocation.
func mode(r *Request) any {
	switch {
	case r.Peek:
		return "1"
	case r.Charge && ManyCallers(r.Rule.Scope):
		return "4"
	case r.Charge:
		return "3"
	case r.WarmLeaseOnly && r.Lease > 0:
		return "2"
	}
	return "0"
}

// Close stops the limiter's flushers; calls after it fail.
func (l *Limiter) Close() { l.batch.close() }

// Reset deletes the request's counter and its owner's penalty record, and
// returns how many keys existed. Keys of one owner share a slot; deleting
// one at a time keeps this correct on a cluster whatever the owners. UNLINK
// frees a large value (a sliding log holds up to its limit in entries) off
// Redis's main thread, where DEL would stall every other check meanwhile.
func (l *Limiter) Reset(ctx context.Context, r Request) (int64, error) {
	var n int64
	for _, k := range []string{r.Key(), keys.Penalty(r.Owner), keys.Block(r.Owner)} {
		d, err := l.rdb.Unlink(ctx, k).Result()
		if err != nil {
			return n, fmt.Errorf("reset %s: %w", r.Rule.ID, err)
		}
		n += d
	}
	return n, nil
}

// Ping reports whether Redis answers.
func (l *Limiter) Ping(ctx context.Context) error {
	if err := l.rdb.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("ping redis: %w", err)
	}
	return nil
}

func parseResult(v any) (Result, error) {
	vals, ok := v.([]any)
	if !ok || len(vals) != 10 {
		return Result{}, fmt.Errorf("script returned %T %v, want 10 integers", v, v)
	}
	var n [10]int64
	for i, x := range vals {
		if n[i], ok = x.(int64); !ok {
			return Result{}, fmt.Errorf("script result %d is %T, want an integer", i, x)
		}
	}
	return Result{
		Allowed:     n[0] == 1,
		Remaining:   max(n[1], 0),
		ResetAfter:  time.Duration(max(n[2], 0)) * time.Millisecond,
		RetryAfter:  time.Duration(max(n[3], 0)) * time.Millisecond,
		Granted:     max(n[4], 0),
		Penalized:   n[5] == 1,
		Credited:    max(n[6], 0),
		WindowStart: max(n[7], 0),
		WindowEnd:   max(n[8], 0),
		Reserved:    max(n[9], 0),
	}, nil
}

func joinInts(v []int64) string {
	if len(v) == 0 {
		return "1"
	}
	parts := make([]string, len(v))
	for i, x := range v {
		parts[i] = strconv.FormatInt(x, 10)
	}
	return strings.Join(parts, ",")
}
