package decision

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-rl/tollgate/controlsvc/internal/config"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/limiter"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/metrics"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/policy"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/store/apikeys"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/store/audit"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/store/overrides"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// In-memory doubles of the service's collaborators: the decision core is
// tested here without Redis; the app tests run it against a real one.

// memCounters is a fixed-window counter per key with no clock: a counter
// admits its rule's capacity, then refuses with the rule's window as the
// wait. Leases and refunds follow the scripts' contract: a lease takes at
// most LeaseFraction of what is left after the cost, and a refund gives
// back at most what the counter still has leased.
type memCounters struct {
	mu     sync.Mutex
	used   map[string]int64
	leased map[string]int64
	calls  []limiter.Request
	// fail makes every call fail as a Redis outage would.
	fail error
	// retryExtra lengthens a denial's wait past the window's end, as a
	// sliding window's weighted count or a penalty does.
	retryExtra time.Duration
	// windowLeft, when set for a rule id, is how long that rule's window
	// has left (its ResetAfter) instead of the whole window.
	windowLeft map[string]time.Duration
}

func newMemCounters() *memCounters {
	return &memCounters{used: map[string]int64{}, leased: map[string]int64{}}
}

func (m *memCounters) Do(_ context.Context, r limiter.Request) (limiter.Result, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.calls = append(m.calls, r)
	if m.fail != nil {
		return limiter.Result{}, m.fail
	}
	k := r.Key()
	capacity := r.Rule.Capacity()
	window := time.Duration(r.Rule.WindowSeconds) * time.Second
	var res limiter.Result
	if r.Returned > 0 && !r.Peek {
		res.Credited = min(r.Returned, m.leased[k])
		m.leased[k] -= res.Credited
		m.used[k] -= res.Credited
	}
	left := capacity - m.used[k]
	switch {
	case r.Peek || r.Cost == 0:
		res.Allowed = left > 0
	case r.Cost <= left:
		res.Allowed = true
		m.used[k] += r.Cost
		left -= r.Cost
		if grant := min(r.Lease, int64(float64(left)*r.LeaseFraction)); grant > 0 {
			res.Granted = grant
			m.used[k] += grant
			m.leased[k] += grant
			left -= grant
		}
	default:
		res.RetryAfter = window + m.retryExtra
	}
	res.Remaining, res.ResetAfter = left, window
	if d, ok := m.windowLeft[r.Rule.ID]; ok {
		res.ResetAfter = d
	}
	return res, nil
}

func (m *memCounters) Reset(_ context.Context, r limiter.Request) (int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	k := r.Key()
	_, had := m.used[k]
	delete(m.used, k)
	delete(m.leased, k)
	if had {
		return 1, nil
	}
	return 0, nil
}

func (m *memCounters) Ping(context.Context) error { return m.fail }

// spent is what the counter of key holds.
func (m *memCounters) spent(key string) int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.used[key]
}

// ruleIDs are the rules of the calls made so far, in order.
func (m *memCounters) ruleIDs() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]string, len(m.calls))
	for i, c := range m.calls {
		out[i] = c.Rule.ID
	}
	return out
}

// memKeys holds API key records by raw key.
type memKeys map[string]apikeys.Record

func (k memKeys) Lookup(_ context.Context, raw string) (apikeys.Record, error) {
	if r, ok := k[raw]; ok {
		return r, nil
	}
	return apikeys.Record{}, apikeys.ErrNotFound
}

func (k memKeys) Get(_ context.Context, id string) (apikeys.Record, error) {
	for _, r := range k {
		if r.ID == id {
			return r, nil
		}
	}
	return apikeys.Record{}, apikeys.ErrNotFound
}

type memOverrides struct {
	mu sync.Mutex
	m  map[[2]string]overrides.Override
}

func (o *memOverrides) Get(id, ep string) (overrides.Override, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	v, ok := o.m[[2]string{id, ep}]
	return v, ok
}

func (o *memOverrides) Set(_ context.Context, id, ep string, ov overrides.Override) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.m == nil {
		o.m = map[[2]string]overrides.Override{}
	}
	o.m[[2]string{id, ep}] = ov
	return nil
}

func (o *memOverrides) Delete(_ context.Context, id, ep string) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.m, [2]string{id, ep})
	return nil
}

func (o *memOverrides) All() []overrides.Entry { return nil }

// memUsage sums what each identity was admitted.
type memUsage struct {
	mu         sync.Mutex
	requests   map[string]int64
	violations map[string]int
	events     []audit.Event
}

func (u *memUsage) Record(id string, _ time.Time, n int64, v *audit.Event) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.requests == nil {
		u.requests, u.violations = map[string]int64{}, map[string]int{}
	}
	u.requests[id] += n
	if v != nil {
		u.violations[id]++
		u.events = append(u.events, *v)
	}
}

type memTrail struct{}

func (memTrail) Append(context.Context, ...audit.Event) error { return nil }

type memReplays struct{}

func (memReplays) Claim(context.Context, string, string) (*wire.BatchCheckResponse, error) {
	return nil, nil
}
func (memReplays) Save(context.Context, string, string, *wire.BatchCheckResponse) error { return nil }

// fixture is a service over doubles, deciding with a config file's model.
type fixture struct {
	svc      *Service
	counters *memCounters
	keys     memKeys
	ovs      *memOverrides
	usage    *memUsage
	// slept records the throttle waits; each one empties the counters, as
	// the wait it stands for would have refilled them.
	slept []time.Duration
}

// newFixture compiles cfgTOML (a config file; "" for the defaults) with
// edit applied, and builds a service over doubles.
func newFixture(t *testing.T, cfgTOML string, edit func(*config.Config)) *fixture {
	t.Helper()
	cfg, err := config.Parse([]byte(cfgTOML), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	if edit != nil {
		edit(cfg)
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
	}
	p, err := policy.Compile(&cfg.Spec, "test")
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{counters: newMemCounters(), keys: memKeys{}, ovs: &memOverrides{}, usage: &memUsage{}}
	f.svc = New(Deps{Counters: f.counters, Keys: f.keys, Overrides: f.ovs, Replays: memReplays{}, Usage: f.usage, Trail: memTrail{},
		Metrics: metrics.New(func() *redis.PoolStats { return &redis.PoolStats{} }), Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Now: time.Now,
		BreakerThreshold: 3, BreakerCooldown: time.Hour,
		Sleep: func(_ context.Context, d time.Duration) bool {
			f.slept = append(f.slept, d)
			f.counters.mu.Lock()
			clear(f.counters.used)
			f.counters.mu.Unlock()
			return true
		}}, p, SettingsOf(cfg))
	return f
}

// check runs one trusted check.
func (f *fixture) check(t *testing.T, req wire.CheckRequest) (wire.CheckResponse, error) {
	t.Helper()
	return f.svc.Check(context.Background(), &req, Trusted)
}

var errRedisDown = errors.New("dial tcp 127.0.0.1:6379: connection refused")
