package app

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-rl/tollgate/controlsvc/internal/config"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/decision"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/limiter"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/memlimit"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/redisconn"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/rls"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/store/apikeys"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/store/audit"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/store/idempotency"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/store/overrides"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/store/ruleset"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/store/summary"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/store/usage"
)

// counters are what decides a counter: the Redis limiter, or memlimit.
type counters interface {
	decision.Counters
	rls.Counters
}

// state is where the service keeps what it counts and what operators
// manage: Redis, shared by every replica, or (redis_enabled = false) this
// process's memory.
type state struct {
	rdb      redis.UniversalClient // nil in memory
	topology string
	limiter  *limiter.Limiter // nil in memory
	counters counters

	overrides *overrides.Store
	ruleset   *ruleset.Store
	trail     *audit.Store
	keys      *apikeys.Store
	replays   *idempotency.Store
	usage     usage.Store
	summary   summary.Store
}

// inMemoryCounters bounds the counters of a service without Redis: ten
// times the outage limiter's, since these are all its counters (about 250
// bytes each).
const inMemoryCounters = 1_000_000

func openState(cfg *config.Config, log *slog.Logger) (*state, error) {
	if !cfg.RedisEnabled {
		return &state{topology: "none (in memory)", counters: memlimit.Counters{L: memlimit.NewSized(1, inMemoryCounters, time.Now)},
			overrides: overrides.NewMemory(), ruleset: ruleset.NewMemory(), trail: audit.NewMemory(time.Now),
			keys: apikeys.NewMemory(time.Now), replays: idempotency.NewMemory(time.Now), usage: usage.InMemory(time.Now), summary: summary.InMemory(time.Now)}, nil
	}
	redisconn.SetLogger(log)
	rdb, topology, err := redisconn.New(cfg.RedisURL, cfg.RedisTimeout(), cfg.RedisPoolSize)
	if err != nil {
		return nil, fmt.Errorf("redis: %w", err)
	}
	lim, err := limiter.New(rdb)
	if err != nil {
		return nil, fmt.Errorf("limiter: %w", err)
	}
	return &state{rdb: rdb, topology: string(topology), limiter: lim, counters: lim,
		overrides: overrides.New(rdb), ruleset: ruleset.New(rdb), trail: audit.New(rdb),
		keys: apikeys.New(rdb, time.Now), replays: idempotency.New(rdb), usage: usage.InRedis(rdb), summary: summary.InRedis(rdb)}, nil
}
