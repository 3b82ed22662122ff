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
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-rl/tollgate/controlsvc/internal/keys"
	"github.com/tollgate-rl/tollgate/shared/rules"
)

//go:embed lua/*.lua
var luaFiles embed.FS

// Scripter is the part of a Redis client the limiter needs. A single client, a
// sentinel-backed client and a cluster client all satisfy it.
type Scripter = redis.Scripter

// Quota is what a counter allows.
type Quota struct {
	Algorithm     rules.Algorithm
	Limit         int64 // tokens per window
	WindowSeconds int64
	// Capacity is the bucket size of token_bucket and gcra (the burst); the
	// window algorithms ignore it. 0 means Limit.
	Capacity int64
}

// Penalty is the progressive penalty policy: from the Threshold-th violation
// within Window on, the wait of a denial is multiplied by the next entry of
// Multipliers (the last one repeats) and enforced.
type Penalty struct {
	Window      time.Duration
	Threshold   int64
	Multipliers []int64
}

// Request is one call to a counter.
type Request struct {
	// Owner names the counter's owner (its hash tag); Key is the counter.
	Owner keys.Owner
	Key   string
	Quota Quota
	// Cost is what this request spends; 0 reads the counter without spending.
	Cost int64
	// Lease is how many extra tokens to take for the caller's local cache;
	// Returned gives back unspent tokens of an earlier lease.
	Lease    int64
	Returned int64
	// LeaseFraction caps a lease at this share of what is left.
	LeaseFraction float64
	// Peek reads without writing anything (status queries).
	Peek bool
	// Penalty is nil when progressive penalties are off.
	Penalty *Penalty
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
	// Penalized is true when a progressive penalty lengthened or caused the
	// denial.
	Penalized bool
}

// Limiter runs the scripts against one Redis client.
type Limiter struct {
	rdb     Scripter
	scripts map[rules.Algorithm]*redis.Script
}

// New loads the embedded scripts. It does not talk to Redis; scripts are sent
// with EVALSHA and loaded on the first NOSCRIPT.
func New(rdb Scripter) (*Limiter, error) {
	prelude, err := luaFiles.ReadFile("lua/prelude.lua")
	if err != nil {
		return nil, fmt.Errorf("read prelude: %w", err)
	}
	epilogue, err := luaFiles.ReadFile("lua/epilogue.lua")
	if err != nil {
		return nil, fmt.Errorf("read epilogue: %w", err)
	}
	l := &Limiter{rdb: rdb, scripts: make(map[rules.Algorithm]*redis.Script, len(rules.Algorithms))}
	for _, a := range rules.Algorithms {
		body, err := luaFiles.ReadFile("lua/" + string(a) + ".lua")
		if err != nil {
			return nil, fmt.Errorf("read script %s: %w", a, err)
		}
		l.scripts[a] = redis.NewScript(string(prelude) + "\n" + string(body) + "\n" + string(epilogue))
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
	return nil
}

// ErrBadRequest is wrapped by errors about the request itself, not Redis.
var ErrBadRequest = errors.New("bad limiter request")

// Do runs one counter.
func (l *Limiter) Do(ctx context.Context, r Request) (Result, error) {
	s, ok := l.scripts[r.Quota.Algorithm]
	if !ok {
		return Result{}, fmt.Errorf("%w: unknown algorithm %q", ErrBadRequest, r.Quota.Algorithm)
	}
	if r.Quota.Limit <= 0 || r.Quota.WindowSeconds <= 0 || r.Cost < 0 || r.Lease < 0 || r.Returned < 0 {
		return Result{}, fmt.Errorf("%w: limit, window, cost, lease and returned must be positive", ErrBadRequest)
	}
	capacity := r.Quota.Capacity
	if capacity <= 0 {
		capacity = r.Quota.Limit
	}
	args := make([]any, 0, 12)
	args = append(args,
		r.Quota.Limit,
		r.Quota.WindowSeconds*1000,
		capacity,
		r.Cost,
		r.Lease,
		r.Returned,
		strconv.FormatFloat(r.LeaseFraction, 'f', -1, 64),
		boolArg(r.Peek),
	)
	if p := r.Penalty; p != nil {
		args = append(args, "1", p.Window.Milliseconds(), p.Threshold, joinInts(p.Multipliers))
	} else {
		args = append(args, "0", 0, 0, "1")
	}
	ks := []string{r.Key, keys.Penalty(r.Owner), keys.Block(r.Owner)}
	var v any
	var err error
	if r.Peek {
		// A read-only script may run on a replica; leave that choice to the
		// client (RunRO uses EVALSHA_RO).
		v, err = s.RunRO(ctx, l.rdb, ks, args...).Result()
	} else {
		v, err = s.Run(ctx, l.rdb, ks, args...).Result()
	}
	if err != nil {
		return Result{}, fmt.Errorf("run %s script: %w", r.Quota.Algorithm, err)
	}
	return parseResult(v)
}

func parseResult(v any) (Result, error) {
	vals, ok := v.([]any)
	if !ok || len(vals) != 6 {
		return Result{}, fmt.Errorf("script returned %T %v, want 6 integers", v, v)
	}
	var n [6]int64
	for i, x := range vals {
		if n[i], ok = x.(int64); !ok {
			return Result{}, fmt.Errorf("script result %d is %T, want an integer", i, x)
		}
	}
	return Result{
		Allowed:    n[0] == 1,
		Remaining:  max(n[1], 0),
		ResetAfter: time.Duration(max(n[2], 0)) * time.Millisecond,
		RetryAfter: time.Duration(max(n[3], 0)) * time.Millisecond,
		Granted:    max(n[4], 0),
		Penalized:  n[5] == 1,
	}, nil
}

func boolArg(b bool) string {
	if b {
		return "1"
	}
	return "0"
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
