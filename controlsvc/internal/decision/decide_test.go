package decision

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/controlsvc/internal/apierr"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/config"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/limiter"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/store/apikeys"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/store/overrides"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// model is the config file the decision-core tests decide with.
const model = `
[[tiers]]
name = "free"
limit = 5
window_seconds = 60
endpoints = { "/api/v1/search" = 2 }

[[tiers]]
name = "premium"
limit = 50
window_seconds = 60

[[tiers]]
name = "flat"
limit = 50
window_seconds = 60
per_endpoint = false

[exemptions]
ips = ["10.9.0.0/16"]
users = ["ops"]

[[rules]]
id = "login"
path = "/auth/login"
methods = ["POST"]
scope = "ip"
algorithm = "fixed_window"
limit = 3
window_seconds = 60

[[rules]]
id = "uploads"
path = "/api/v1/uploads/**"
scope = "user"
algorithm = "token_bucket"
limit = 10
window_seconds = 60
priority = 10

[[rules]]
id = "uploads_big"
path = "/api/v1/uploads/big"
scope = "user"
algorithm = "token_bucket"
limit = 4
window_seconds = 60
priority = 10

[[rules]]
id = "uploads_delete"
path = "/api/v1/uploads/**"
methods = ["DELETE"]
scope = "user"
algorithm = "token_bucket"
limit = 2
window_seconds = 60
priority = 20

[[rules]]
id = "exports"
path = "/api/v1/exports"
methods = ["GET"]
scope = "identity"
algorithm = "sliding_window"
limit = 2
window_seconds = 60

[[rules]]
id = "ceiling"
path = "/api/v1/uploads/**"
scope = "global"
algorithm = "fixed_window"
limit = 1000
window_seconds = 60

[[rules]]
id = "tenant_reports"
path = "/api/v1/reports"
scope = "tenant"
algorithm = "fixed_window"
limit = 100
window_seconds = 60

[[rules]]
id = "shadow"
path = "/api/v1/beta"
scope = "identity"
algorithm = "fixed_window"
limit = 1
window_seconds = 60
action = "log_only"

[[rules]]
id = "off"
path = "/api/v1/items"
scope = "identity"
algorithm = "fixed_window"
limit = 1
window_seconds = 60
enabled = false
`

// rawKey is an API key of the key store double, issued to user 42 in the
// premium tier.
const rawKey = "ak_live_0123456789abcdefghijklmnopqrstuvwxyzABCDEFG"

func withKey(f *fixture) *fixture {
	f.keys[rawKey] = apikeys.Record{ID: "k_1", UserID: "42", TierID: 2, Tier: "premium", Status: apikeys.StatusActive}
	return f
}

// Which rules decide a request: one winner per scope, priority first, ties
// to the more specific pattern; the tier when no rule matches; exemptions
// before everything; an override or the check's own limit instead of rules.
func TestRuleSelection(t *testing.T) {
	limit := int64(7)
	for _, tt := range []struct {
		name string
		req  wire.CheckRequest
		want []string // rules counted, in the order scopes are reported
	}{
		{"anonymous login counts by address", wire.CheckRequest{UserID: "ip:192.0.2.1", Endpoint: "/auth/login", Method: "POST"}, []string{"login", "tier_free.total", "tier_free"}},
		{"a GET of the login path is no login", wire.CheckRequest{UserID: "ip:192.0.2.1", Endpoint: "/auth/login", Method: "GET"}, []string{"tier_free.total", "tier_free"}},
		{"no rule: the caller's tier", wire.CheckRequest{UserID: "alice", Endpoint: "/api/v1/items", Tier: "premium"}, []string{"tier_premium.total", "tier_premium"}},
		{"unknown tier: the default tier", wire.CheckRequest{UserID: "alice", Endpoint: "/api/v1/items", Tier: "gold"}, []string{"tier_free.total", "tier_free"}},
		{"tier endpoint beats tier default", wire.CheckRequest{UserID: "alice", Endpoint: "/api/v1/search"}, []string{"tier_free.total", "tier_free_ep_21dc69f86e05fc2b"}}, // its path's FNV-1a
		{"priority tie: the more specific pattern", wire.CheckRequest{UserID: "alice", Endpoint: "/api/v1/uploads/big", Method: "POST"}, []string{"uploads_big", "tier_free.total", "tier_free", "ceiling"}},
		{"priority tie, other path: the glob", wire.CheckRequest{UserID: "alice", Endpoint: "/api/v1/uploads/small", Method: "POST"}, []string{"uploads", "tier_free.total", "tier_free", "ceiling"}},
		{"higher priority beats specificity", wire.CheckRequest{UserID: "alice", Endpoint: "/api/v1/uploads/big", Method: "DELETE"}, []string{"uploads_delete", "tier_free.total", "tier_free", "ceiling"}},
		{"HEAD counts under a GET rule, which replaces the tier (its total still counts)", wire.CheckRequest{UserID: "alice", Endpoint: "/api/v1/exports", Method: "HEAD"}, []string{"exports", "tier_free.total"}},
		{"POST is not under a GET rule", wire.CheckRequest{UserID: "alice", Endpoint: "/api/v1/exports", Method: "POST"}, []string{"tier_free.total", "tier_free"}},
		{"user scope skips an address caller", wire.CheckRequest{UserID: "ip:192.0.2.1", Endpoint: "/api/v1/uploads/small"}, []string{"tier_free.total", "tier_free", "ceiling"}},
		{"tenant scope with a tenant", wire.CheckRequest{UserID: "alice", Endpoint: "/api/v1/reports", Tenant: "acme"}, []string{"tier_free.total", "tier_free", "tenant_reports"}},
		{"tenant scope without one", wire.CheckRequest{UserID: "alice", Endpoint: "/api/v1/reports"}, []string{"tier_free.total", "tier_free"}},
		{"a disabled rule matches nothing", wire.CheckRequest{UserID: "alice", Endpoint: "/api/v1/items"}, []string{"tier_free.total", "tier_free"}},
		{"paths are normalised before matching", wire.CheckRequest{UserID: "alice", Endpoint: "/api//v1/./uploads/%62ig;x?y", Method: "POST"}, []string{"uploads_big", "tier_free.total", "tier_free", "ceiling"}},
		{"exempt address", wire.CheckRequest{UserID: "ip:10.9.3.4", Endpoint: "/auth/login", Method: "POST"}, nil},
		{"exempt user", wire.CheckRequest{UserID: "ops", Endpoint: "/api/v1/uploads/big"}, nil},
		{"the check's own limit", wire.CheckRequest{UserID: "alice", Endpoint: "/api/v1/uploads/big", Limit: &limit}, []string{"request"}},
		{"a key caller: its user and its address", wire.CheckRequest{UserID: "ip:192.0.2.9", Endpoint: "/api/v1/uploads/big", APIKey: rawKey, Method: "POST"}, []string{"uploads_big", "tier_premium.total", "tier_premium", "ceiling"}},
		{"a key caller's address counts for ip rules", wire.CheckRequest{UserID: "ip:192.0.2.9", Endpoint: "/auth/login", APIKey: rawKey, Method: "POST"}, []string{"login", "tier_premium.total", "tier_premium"}},
		{"a key caller gets its key's tier", wire.CheckRequest{UserID: "ip:192.0.2.9", Endpoint: "/api/v1/items", APIKey: rawKey}, []string{"tier_premium.total", "tier_premium"}},
		{"a JWT caller's address counts for ip rules", wire.CheckRequest{UserID: "alice", ClientAddress: "192.0.2.7", Endpoint: "/auth/login", Method: "POST"}, []string{"login", "tier_free.total", "tier_free"}},
		{"a method override counts under the named method", wire.CheckRequest{UserID: "ip:192.0.2.1", Endpoint: "/auth/login", Method: "GET", MethodOverride: "POST"}, []string{"login", "tier_free.total", "tier_free"}},
		{"a log-only rule replaces no tier", wire.CheckRequest{UserID: "alice", Endpoint: "/api/v1/beta"}, []string{"shadow", "tier_free.total", "tier_free"}},
		// A form body's override is checked after the headers were counted
		// under the request's method: only what it adds counts then.
		{"override only: the rule the override adds", wire.CheckRequest{UserID: "ip:192.0.2.1", Endpoint: "/auth/login", Method: "GET", MethodOverride: "POST", OverrideOnly: true}, []string{"login"}},
		{"override only: the tier it replaced is no addition", wire.CheckRequest{UserID: "alice", Endpoint: "/api/v1/exports", Method: "POST", MethodOverride: "GET", OverrideOnly: true}, []string{"exports"}},
		{"override only: a winner of a scope the method had", wire.CheckRequest{UserID: "alice", Endpoint: "/api/v1/uploads/big", Method: "POST", MethodOverride: "DELETE", OverrideOnly: true}, []string{"uploads_delete"}},
		{"override only: nothing added, nothing counted", wire.CheckRequest{UserID: "alice", Endpoint: "/api/v1/items", Method: "POST", MethodOverride: "PUT", OverrideOnly: true}, []string{}},
		{"a tier counting one counter has no total", wire.CheckRequest{UserID: "alice", Endpoint: "/api/v1/items", Tier: "flat"}, []string{"tier_flat"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := withKey(newFixture(t, model, nil))
			resp, err := f.check(t, tt.req)
			if err != nil {
				t.Fatal(err)
			}
			if got := f.counters.ruleIDs(); !slices.Equal(got, tt.want) {
				t.Fatalf("counted %v, want %v", got, tt.want)
			}
			if tt.want == nil && (resp.RuleID != "exempt" || !resp.Allowed) {
				t.Fatalf("exempt caller answered %+v", resp)
			}
		})
	}
}

// An override replaces the rules for its caller and endpoint only.
func TestOverrideSelection(t *testing.T) {
	f := newFixture(t, model, nil)
	_ = f.ovs.Set(context.Background(), "user:alice", "/api/v1/uploads/big", overrides.Override{Limit: 2, WindowSeconds: 60, Algorithm: "fixed_window"})
	for _, tt := range []struct {
		user, endpoint string
		want           string
	}{
		{"alice", "/api/v1/uploads/big", "override"},
		{"alice", "/api/v1/uploads/small", "uploads"},
		{"bob", "/api/v1/uploads/big", "uploads_big"},
	} {
		f.counters.calls = nil
		if _, err := f.check(t, wire.CheckRequest{UserID: tt.user, Endpoint: tt.endpoint}); err != nil {
			t.Fatal(err)
		}
		if got := f.counters.ruleIDs(); !slices.Contains(got, tt.want) || slices.Contains(got, "override") != (tt.want == "override") {
			t.Errorf("%s %s: counted %v, want %s", tt.user, tt.endpoint, got, tt.want)
		}
	}
	// The override's limit decides.
	for i, want := range []bool{true, false} {
		resp, err := f.check(t, wire.CheckRequest{UserID: "alice", Endpoint: "/api/v1/uploads/big"})
		if err != nil || resp.Allowed != want || resp.RuleID != "override" {
			t.Fatalf("check %d under the override: %+v %v", i+2, resp, err)
		}
	}
	// It replaces the rules that count that caller itself, not those of
	// other scopes: a limit every caller shares (ceiling), or the address
	// of a JWT caller (login, per address).
	_ = f.ovs.Set(context.Background(), "user:carol", "/auth/login", overrides.Override{Limit: 1000, WindowSeconds: 60, Algorithm: "fixed_window"})
	_ = f.ovs.Set(context.Background(), "user:carol", "/api/v1/uploads/big", overrides.Override{Limit: 1000, WindowSeconds: 60, Algorithm: "fixed_window"})
	for _, tt := range []struct {
		req  wire.CheckRequest
		want []string
	}{
		{wire.CheckRequest{UserID: "carol", Endpoint: "/api/v1/uploads/big", Method: "POST"}, []string{"override", "ceiling"}},
		{wire.CheckRequest{UserID: "carol", ClientAddress: "192.0.2.7", Endpoint: "/auth/login", Method: "POST"}, []string{"override", "login"}},
	} {
		f.counters.calls = nil
		if _, err := f.check(t, tt.req); err != nil {
			t.Fatal(err)
		}
		if got := f.counters.ruleIDs(); !slices.Equal(got, tt.want) {
			t.Errorf("%s %s: counted %v, want %v", tt.req.UserID, tt.req.Endpoint, got, tt.want)
		}
	}
}

// The verdict over several rules: denied when any rejecting rule denies,
// reported by the denial with the longest wait; a log-only denial lets the
// request through, flagged; allowed answers report the rule with the least
// left (as a share of its capacity).
func TestVerdictAcrossRules(t *testing.T) {
	t.Run("the tighter rule denies", func(t *testing.T) {
		f := newFixture(t, model, nil)
		var last wire.CheckResponse
		for i := 0; i < 5; i++ {
			resp, err := f.check(t, wire.CheckRequest{UserID: "alice", Endpoint: "/api/v1/uploads/big"})
			if err != nil {
				t.Fatal(err)
			}
			if want := i < 4; resp.Allowed != want {
				t.Fatalf("check %d: allowed %v, want %v", i+1, resp.Allowed, want)
			}
			last = resp
		}
		if last.RuleID != "uploads_big" || last.RetryAfter != 60 || last.Limit != 4 || last.Remaining != 0 {
			t.Fatalf("denial: %+v", last)
		}
	})
	t.Run("the least left is reported", func(t *testing.T) {
		f := newFixture(t, model, nil)
		resp, _ := f.check(t, wire.CheckRequest{UserID: "alice", Endpoint: "/api/v1/uploads/big"})
		if resp.RuleID != "uploads_big" || resp.Remaining != 3 || resp.Limit != 4 {
			t.Fatalf("allowed answer: %+v", resp)
		}
	})
	t.Run("a global ceiling denies everybody", func(t *testing.T) {
		f := newFixture(t, model, func(c *config.Config) {
			for i := range c.Rules {
				if c.Rules[i].ID == "ceiling" {
					c.Rules[i].Limit = 3
				}
			}
		})
		for i, user := range []string{"a", "b", "c", "d"} {
			resp, err := f.check(t, wire.CheckRequest{UserID: user, Endpoint: "/api/v1/uploads/small"})
			if err != nil {
				t.Fatal(err)
			}
			if want := i < 3; resp.Allowed != want || (!want && resp.RuleID != "ceiling") {
				t.Fatalf("caller %s: %+v", user, resp)
			}
		}
	})
	t.Run("log only", func(t *testing.T) {
		f := newFixture(t, model, nil)
		f.check(t, wire.CheckRequest{UserID: "alice", Endpoint: "/api/v1/beta"})
		resp, err := f.check(t, wire.CheckRequest{UserID: "alice", Endpoint: "/api/v1/beta"})
		if err != nil || !resp.Allowed || !resp.LogOnly || resp.RuleID != "shadow" {
			t.Fatalf("log-only denial: %+v %v", resp, err)
		}
		if f.usage.violations["user:alice"] != 0 {
			t.Fatalf("a log-only denial was recorded as a violation")
		}
	})
	t.Run("a cost no rule can ever allow touches nothing", func(t *testing.T) {
		f := newFixture(t, model, nil)
		_, err := f.check(t, wire.CheckRequest{UserID: "alice", Endpoint: "/api/v1/uploads/big", Cost: 5})
		var ae *apierr.Error
		if !errors.As(err, &ae) || ae.Details["field"] != "cost" || len(f.counters.calls) != 0 {
			t.Fatalf("cost above the capacity: %v, %d calls", err, len(f.counters.calls))
		}
	})
}

// Redis failures follow the failure mode; the breaker stops calls after
// repeated failures; a request the limiter refuses is no Redis failure.
func TestFailureModes(t *testing.T) {
	req := wire.CheckRequest{UserID: "alice", Endpoint: "/api/v1/uploads/big"}
	t.Run("fail open", func(t *testing.T) {
		f := newFixture(t, model, nil)
		f.counters.fail = errRedisDown
		resp, err := f.check(t, req)
		if err != nil || !resp.Allowed || !resp.Degraded || resp.Limit != 0 {
			t.Fatalf("fail open: %+v %v", resp, err)
		}
	})
	t.Run("fail closed", func(t *testing.T) {
		f := newFixture(t, model, func(c *config.Config) { c.FailureMode = config.FailClosed })
		f.counters.fail = errRedisDown
		_, err := f.check(t, req)
		var ae *apierr.Error
		if !errors.As(err, &ae) || ae.Code != wire.CodeServiceUnavailable || ae.Details["failure_mode"] != config.FailClosed {
			t.Fatalf("fail closed: %v", err)
		}
	})
	t.Run("the breaker stops calls", func(t *testing.T) {
		f := newFixture(t, model, nil)
		f.counters.fail = errRedisDown
		for i := 0; i < 10; i++ {
			f.check(t, req)
		}
		// Two rules a check: the third failure opens the breaker (threshold 3).
		if n := len(f.counters.calls); n != 3 {
			t.Fatalf("%d counter calls with the breaker at 3 failures", n)
		}
		if !f.svc.BreakerOpen() {
			t.Fatal("breaker closed after 10 failing checks")
		}
	})
	t.Run("a probe that meets one node's trouble lets the next call probe", func(t *testing.T) {
		// A cluster failover: every node answered CLUSTERDOWN, the breaker
		// opened; once the cluster is back the probe lands on a node that
		// is not answering, and says nothing of the others: the next
		// check asks Redis (attack 49: every caller degraded for a
		// cooldown more).
		f := newFixture(t, model, nil)
		clock := time.Unix(1_800_000_000, 0)
		f.svc.now = func() time.Time { return clock }
		f.counters.fail = errRedisDown
		for range 3 {
			f.check(t, req)
		}
		if !f.svc.BreakerOpen() {
			t.Fatal("breaker closed after failing checks")
		}
		clock = clock.Add(2 * time.Hour) // past the cooldown
		f.counters.fail = fmt.Errorf("%w: 127.0.0.1:7001", limiter.ErrNodeDown)
		f.check(t, req)
		f.counters.fail = nil
		if r, _ := f.check(t, req); r.Degraded || f.svc.BreakerOpen() {
			t.Fatalf("the check after a node-local probe: degraded %v, breaker open %v", r.Degraded, f.svc.BreakerOpen())
		}
	})
	t.Run("a script's own error is no outage", func(t *testing.T) {
		f := newFixture(t, model, nil)
		f.counters.fail = fmt.Errorf("%w: damaged state", limiter.ErrScript)
		for i := 0; i < 10; i++ {
			_, err := f.check(t, req)
			var ae *apierr.Error
			if !errors.As(err, &ae) || ae.Code != wire.CodeInternal {
				t.Fatalf("a script error: %v; want 500 INTERNAL_ERROR", err)
			}
		}
		if f.svc.BreakerOpen() {
			t.Fatal("script errors opened the breaker")
		}
	})
	t.Run("a refused script request is no outage", func(t *testing.T) {
		f := newFixture(t, model, nil)
		f.counters.fail = limiter.ErrBadRequest
		for i := 0; i < 10; i++ {
			_, err := f.check(t, req)
			var ae *apierr.Error
			if !errors.As(err, &ae) || ae.Kind.ClientError() && ae.Code == "" {
				t.Fatalf("a bad request: %v", err)
			}
		}
		if f.svc.BreakerOpen() {
			t.Fatal("bad requests opened the breaker")
		}
	})
}

// Leases: one rule's counter grants at most the lease fraction of what is
// left and never beyond lease.max; several rules grant none; a refund gives
// back at most what was leased; usage counts the cost and the lease, less
// what came back.
func TestLeasesAndRefunds(t *testing.T) {
	f := newFixture(t, model, func(c *config.Config) { c.Lease.Fraction, c.Lease.Max = 0.5, 3 })
	one := wire.CheckRequest{UserID: "alice", Endpoint: "/api/v1/items", Tier: "premium", Lease: 10}
	resp, err := f.check(t, one)
	if err != nil || resp.Lease.Granted != 3 || resp.Lease.TTLMs <= 0 {
		t.Fatalf("lease on one rule: %+v %v", resp.Lease, err)
	}
	key := f.counters.calls[0].Key()
	if got := f.counters.spent(key); got != 4 {
		t.Fatalf("counter holds %d after a check and a lease of 3, want 4", got)
	}
	back := one
	back.Lease, back.Returned = 0, 5
	if _, err := f.check(t, back); err != nil {
		t.Fatal(err)
	}
	if got := f.counters.spent(key); got != 2 {
		t.Fatalf("counter holds %d after two checks and 3 of 5 claimed tokens given back, want 2", got)
	}
	if got := f.usage.requests["user:alice"]; got != 2 {
		t.Fatalf("usage %d, want the two requests", got)
	}
	// Four rules (the ceiling, uploads_big, the tier and its total): the
	// lease is what the tightest grants (uploads_big: 4 - 1 = 3 left, half
	// of it floored is 1), and no counter keeps more than it granted.
	two := wire.CheckRequest{UserID: "alice", Endpoint: "/api/v1/uploads/big", Lease: 10}
	f.counters.calls = nil
	resp, err = f.check(t, two)
	if err != nil || resp.Lease.Granted != 1 {
		t.Fatalf("a lease over four rules: %+v %v", resp.Lease, err)
	}
	for _, c := range f.counters.calls {
		if c.Returned == 0 {
			if got, want := f.counters.spent(c.Key()), int64(2); got != want && c.Rule.ID != "tier_free.total" {
				t.Errorf("rule %s holds %d, want the request and the lease (%d)", c.Rule.ID, got, want)
			}
		}
	}
	if got := f.counters.leased[f.counters.calls[0].Key()]; got != 1 {
		t.Fatalf("the ceiling keeps %d leased, want 1", got)
	}
	off := newFixture(t, model, func(c *config.Config) { c.Lease.Fraction = 0 })
	if resp, _ := off.check(t, one); resp.Lease.Granted != 0 || off.counters.calls[0].Lease != 0 {
		t.Fatalf("leases off granted %+v", resp.Lease)
	}
}

// What an untrusted caller may not name is refused before any counter is
// touched.
func TestUntrustedFieldsTouchNothing(t *testing.T) {
	f := newFixture(t, model, nil)
	for _, req := range []wire.CheckRequest{
		{UserID: "alice", Endpoint: "/x", Tier: "premium"},
		{UserID: "alice", Endpoint: "/x", Tenant: "acme"},
		{UserID: "alice", Endpoint: "/x", Cost: 2},
		{UserID: "alice", Endpoint: "/x", Lease: 1},
		{UserID: "alice", Endpoint: "/x", Returned: 1},
		{UserID: "alice", Endpoint: "/x", Spent: 5},
		{UserID: "alice", Endpoint: "/x", ClientAddress: "192.0.2.1"},
		{UserID: "key:k_1", Endpoint: "/x"},
		{UserID: "alice", Endpoint: "/x", Method: "POST", MethodOverride: "DELETE", OverrideOnly: true},
	} {
		_, err := f.svc.Check(context.Background(), &req, Untrusted)
		var ae *apierr.Error
		if !errors.As(err, &ae) || !strings.Contains(ae.Message, "credential") && ae.Code != wire.CodeForbidden {
			t.Errorf("%+v: %v", req, err)
		}
	}
	if n := len(f.counters.calls); n != 0 {
		t.Fatalf("refused checks made %d counter calls", n)
	}
}

// Neither walk-around of the tier model works: a rule of another scope
// (the ceiling an operator adds on every path) never lifts the tier, and
// walking distinct paths of a per-endpoint tier stops at its total.
func TestTierCannotBeWalkedAround(t *testing.T) {
	t.Run("a ceiling does not lift the tier", func(t *testing.T) {
		f := newFixture(t, model+`
[[rules]]
id = "ceiling_all"
path = "/**"
scope = "user"
algorithm = "fixed_window"
limit = 1000
window_seconds = 60
`, nil)
		admitted := 0
		for i := 0; i < 30; i++ {
			if resp, err := f.check(t, wire.CheckRequest{UserID: "free_caller", Endpoint: "/api/v1/items"}); err == nil && resp.Allowed {
				admitted++
			}
		}
		if admitted != 5 {
			t.Fatalf("a free caller (5 per endpoint) under a 1,000 ceiling got %d of 30", admitted)
		}
	})
	t.Run("distinct paths stop at the total", func(t *testing.T) {
		f := newFixture(t, model, nil)
		admitted := 0
		for i := 0; i < 200; i++ {
			resp, err := f.check(t, wire.CheckRequest{UserID: "walker", Endpoint: fmt.Sprintf("/api/v1/items/%d", i)})
			if err != nil {
				t.Fatal(err)
			}
			if resp.Allowed {
				admitted++
			} else if resp.RuleID != "tier_free.total" {
				t.Fatalf("path %d refused by %s, want the tier's total", i, resp.RuleID)
			}
		}
		if want := 5 * 10; admitted != want {
			t.Fatalf("walking 200 distinct paths admitted %d, want the total %d", admitted, want)
		}
	})
	// "/login.php/x" runs login.php with the path info "/x" (PHP's own
	// server, nginx and Apache as usually set up): rules naming the
	// script's path count it, beside the route a front controller would
	// read ("/x"). An outsider ran a login script 50 times past a rule of 3
	// as "/login.php/{i}", and an endpoint limit on "/admin.php" 10 of 10.
	t.Run("a PHP script's path info", func(t *testing.T) {
		f := newFixture(t, model+`
[[rules]]
id = "login_php"
path = "/login.php"
methods = ["POST"]
scope = "ip"
algorithm = "fixed_window"
limit = 3
window_seconds = 60
`, nil)
		admitted := 0
		for i := 0; i < 10; i++ {
			resp, err := f.check(t, wire.CheckRequest{UserID: "ip:192.0.2.77", Endpoint: fmt.Sprintf("/login.php/%d", i), Method: "POST"})
			if err != nil {
				t.Fatal(err)
			}
			if resp.Allowed {
				admitted++
			} else if resp.RuleID != "login_php" {
				t.Fatalf("request %d refused by %s, want login_php", i, resp.RuleID)
			}
		}
		if admitted != 3 {
			t.Fatalf("POST /login.php/{i} admitted %d of 10, want the script's rule's 3", admitted)
		}
		// A tier's endpoint limit on a script holds the same way; the tier's
		// default counts the route, not one counter for every route a front
		// controller's path info names.
		f = newFixture(t, strings.Replace(model, `endpoints = { "/api/v1/search" = 2 }`, `endpoints = { "/api/v1/search" = 2, "/admin.php" = 2 }`, 1), nil)
		admitted = 0
		for i := 0; i < 10; i++ {
			if resp, _ := f.check(t, wire.CheckRequest{UserID: "php_admin", Endpoint: fmt.Sprintf("/admin.php/%d", i)}); resp.Allowed {
				admitted++
			}
		}
		if admitted != 2 {
			t.Fatalf("/admin.php/{i} admitted %d of 10, want the endpoint limit's 2", admitted)
		}
		admitted = 0
		for i := 0; i < 10; i++ {
			if resp, _ := f.check(t, wire.CheckRequest{UserID: "front_caller", Endpoint: fmt.Sprintf("/index.php/api/v1/items/%d", i)}); resp.Allowed {
				admitted++
			}
		}
		if admitted != 10 {
			t.Fatalf("ten routes through /index.php admitted %d of 10: the tier's default counted them as one path", admitted)
		}
		// A rule of one counter per path that matches the route too counts
		// the script's path as well (an outsider's "/report.php/{i}" ran 30
		// times from each of two clients against a "/**" cap of 10 for
		// everyone, and "/api/upload.php/{i}" 10 times against 3).
		f = newFixture(t, model+`
[[rules]]
id = "per_path_cap"
path = "/**"
scope = "endpoint"
algorithm = "fixed_window"
limit = 10
window_seconds = 60

[[rules]]
id = "upload"
path = "/api/**"
methods = ["POST"]
scope = "ip"
per_endpoint = true
algorithm = "fixed_window"
limit = 3
window_seconds = 60
`, nil)
		admitted = 0
		for i := 0; i < 30; i++ {
			for _, who := range []string{"ip:192.0.2.81", "ip:192.0.2.82"} {
				if resp, _ := f.check(t, wire.CheckRequest{UserID: who, Endpoint: fmt.Sprintf("/report.php/%d", i)}); resp.Allowed {
					admitted++
				}
			}
		}
		if admitted != 10 {
			t.Fatalf("/report.php/{i} from two clients admitted %d of 60, want the per-path cap's 10", admitted)
		}
		// A script whose path info names it again is one path, counted once.
		admitted = 0
		for i := 0; i < 12; i++ {
			if resp, _ := f.check(t, wire.CheckRequest{UserID: fmt.Sprintf("ip:192.0.2.%d", 90+i), Endpoint: "/twice.php/twice.php"}); resp.Allowed {
				admitted++
			}
		}
		if admitted != 10 {
			t.Fatalf("/twice.php/twice.php admitted %d of 12, want the per-path cap's 10", admitted)
		}
		admitted = 0
		for i := 0; i < 10; i++ {
			if resp, _ := f.check(t, wire.CheckRequest{UserID: "ip:192.0.2.83", Endpoint: fmt.Sprintf("/api/upload.php/%d", i), Method: "POST"}); resp.Allowed {
				admitted++
			}
		}
		if admitted != 3 {
			t.Fatalf("POST /api/upload.php/{i} admitted %d of 10, want the per-path rule's 3", admitted)
		}
		// A key required on a script is required of its path info too.
		f = newFixture(t, "api_key_required_paths = [\"/admin.php\"]\n"+model, nil)
		for _, ep := range []string{"/admin.php", "/admin.php/x", "/admin.php/x/../y"} {
			if _, err := f.check(t, wire.CheckRequest{UserID: "ip:192.0.2.78", Endpoint: ep}); err == nil {
				t.Errorf("%s without an API key was decided, want refused", ep)
			}
		}
		if _, err := f.check(t, wire.CheckRequest{UserID: "ip:192.0.2.78", Endpoint: "/index.php/x"}); err != nil {
			t.Errorf("/index.php/x needs no key: %v", err)
		}
	})
	t.Run("an identity rule replaces the tier on its path only", func(t *testing.T) {
		f := newFixture(t, model+`
[[rules]]
id = "bulk"
path = "/api/v1/bulk"
scope = "identity"
algorithm = "fixed_window"
limit = 20
window_seconds = 60
`, nil)
		admitted := 0
		for i := 0; i < 30; i++ {
			if resp, _ := f.check(t, wire.CheckRequest{UserID: "bulk_caller", Endpoint: "/api/v1/bulk"}); resp.Allowed {
				admitted++
			}
		}
		if admitted != 20 {
			t.Fatalf("the replacing rule admitted %d of 30, want its 20", admitted)
		}
	})
}

// A denial's Reset is never before its Retry-After: a client that comes
// back at Reset is not refused again.
func TestResetIsNeverBeforeRetry(t *testing.T) {
	f := newFixture(t, model, nil)
	f.counters.retryExtra = 25 * time.Second
	var resp wire.CheckResponse
	for i := 0; i < 3; i++ {
		resp, _ = f.check(t, wire.CheckRequest{UserID: "ip:192.0.2.1", Endpoint: "/auth/login", Method: "POST"})
	}
	before := time.Now()
	resp, err := f.check(t, wire.CheckRequest{UserID: "ip:192.0.2.1", Endpoint: "/auth/login", Method: "POST"})
	if err != nil || resp.Allowed || resp.RetryAfter != 85 {
		t.Fatalf("denial %+v %v", resp, err)
	}
	if resp.ResetAt < before.Unix()+resp.RetryAfter {
		t.Fatalf("reset_at %d is before the retry (%d + %d)", resp.ResetAt, before.Unix(), resp.RetryAfter)
	}
}

// The endpoint scope is one counter per path for every caller together:
// two callers share a path's counter, two paths do not share one, and a
// caller's reset never deletes it.
func TestEndpointScope(t *testing.T) {
	f := newFixture(t, model+`
[[rules]]
id = "per_path"
path = "/api/v1/hot/**"
scope = "endpoint"
algorithm = "fixed_window"
limit = 2
window_seconds = 60
`, nil)
	for i, tc := range []struct {
		user, path string
		allowed    bool
	}{
		{"a", "/api/v1/hot/1", true}, {"b", "/api/v1/hot/1", true}, {"c", "/api/v1/hot/1", false},
		{"c", "/api/v1/hot/2", true},
	} {
		resp, err := f.check(t, wire.CheckRequest{UserID: tc.user, Endpoint: tc.path})
		if err != nil || resp.Allowed != tc.allowed {
			t.Fatalf("check %d (%s on %s): %+v %v", i, tc.user, tc.path, resp, err)
		}
	}
	key := ""
	for _, c := range f.counters.calls {
		if c.Rule.ID == "per_path" {
			key = c.Key()
		}
	}
	if !strings.Contains(key, "{endpoint:*}") || !strings.Contains(key, ":/api/v1/hot/2:") {
		t.Fatalf("endpoint counter key %q", key)
	}
	if _, err := f.svc.Reset(context.Background(), &wire.ResetRequest{UserID: "c", Endpoint: "/api/v1/hot/1"}); err != nil {
		t.Fatal(err)
	}
	if resp, _ := f.check(t, wire.CheckRequest{UserID: "d", Endpoint: "/api/v1/hot/1"}); resp.Allowed {
		t.Fatal("a caller's reset deleted the path's shared counter")
	}
}

// Found by an outsider's attack on a running stack: a request its own
// limits refuse spent a counter every caller shares (a global rule was
// asked first), so one client past its limit emptied the global limit for
// everyone; and a per-path identity rule lifted the tier's total, so
// walking paths under it was unbounded (admissions and Redis keys).
func TestOwnLimitsComeBeforeSharedOnes(t *testing.T) {
	f := newFixture(t, model+`
[[rules]]
id = "shared_cap"
path = "/api/v1/shared"
scope = "global"
algorithm = "fixed_window"
limit = 20
window_seconds = 60

[[rules]]
id = "export_per_path"
path = "/api/v1/export/**"
scope = "identity"
algorithm = "fixed_window"
limit = 2
window_seconds = 60
per_endpoint = true
`, nil)
	for i := 0; i < 30; i++ {
		f.check(t, wire.CheckRequest{UserID: "ip:192.0.2.66", Endpoint: "/api/v1/shared"})
	}
	victims := 0
	for i := 0; i < 20; i++ {
		if resp, _ := f.check(t, wire.CheckRequest{UserID: fmt.Sprintf("ip:198.51.100.%d", i), Endpoint: "/api/v1/shared"}); resp.Allowed {
			victims++
		}
	}
	if victims != 15 {
		t.Fatalf("after one client's 30 requests (5 admitted by its tier), %d of 20 others got through the shared 20; want 15", victims)
	}
	admitted := 0
	for i := 0; i < 100; i++ {
		if resp, _ := f.check(t, wire.CheckRequest{UserID: "walker", Endpoint: fmt.Sprintf("/api/v1/export/%d", i)}); resp.Allowed {
			admitted++
		}
	}
	if admitted != 50 {
		t.Fatalf("walking 100 paths under a per-path identity rule admitted %d; the tier's total is 50", admitted)
	}
	keys := 0
	for k := range f.counters.used {
		if strings.Contains(k, "export_per_path") {
			keys++
		}
	}
	if keys != 50 {
		t.Fatalf("%d per-path counters for 50 admitted requests", keys)
	}
}

// Usage counts requests made: a check's cost when admitted, and the lease
// tokens the filter reports spending, admitted or not; a lease granted is
// not counted until its tokens are reported spent.
func TestUsageCountsRequestsNotLeases(t *testing.T) {
	f := newFixture(t, model, func(c *config.Config) { c.Lease.Fraction, c.Lease.Max = 0.5, 10 })
	req := wire.CheckRequest{UserID: "alice", Endpoint: "/api/v1/items", Tier: "premium", Lease: 10}
	f.check(t, req) // a path's first call leases nothing (two counters)
	resp, _ := f.check(t, req)
	if resp.Lease.Granted == 0 {
		t.Fatal("no lease to test with")
	}
	if got := f.usage.requests["user:alice"]; got != 2 {
		t.Fatalf("usage %d after two checks and a lease of %d, want 2", got, resp.Lease.Granted)
	}
	req.Spent = 4 // the filter spent four of the lease's tokens
	f.check(t, req)
	if got := f.usage.requests["user:alice"]; got != 7 {
		t.Fatalf("usage %d after a third check reporting 4 spent, want 7", got)
	}
}

// A throttle rule delays a refused request until the rule would admit it,
// once, when that is within throttle_max_wait_ms; past the bound it
// refuses, as reject does. The rules asked before it are not asked twice.
func TestThrottle(t *testing.T) {
	const rule = `
[[rules]]
id = "slow_down"
path = "/api/v1/slow"
scope = "identity"
algorithm = "fixed_window"
limit = 2
window_seconds = 1
action = "throttle"
`
	for _, tc := range []struct {
		name    string
		maxWait time.Duration
		allowed bool
	}{{"within the bound", 2 * time.Second, true}, {"past the bound", 500 * time.Millisecond, false}} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, model+rule, func(c *config.Config) { c.ThrottleMaxWaitMs = int(tc.maxWait.Milliseconds()) })
			for i := 0; i < 2; i++ {
				f.check(t, wire.CheckRequest{UserID: "alice", Endpoint: "/api/v1/slow"})
			}
			f.counters.calls = nil
			resp, err := f.check(t, wire.CheckRequest{UserID: "alice", Endpoint: "/api/v1/slow", Returned: 3})
			if err != nil || resp.Allowed != tc.allowed {
				t.Fatalf("third request: %+v %v; want allowed %v", resp, err, tc.allowed)
			}
			if tc.allowed {
				if len(f.slept) != 1 || f.slept[0] != time.Second {
					t.Fatalf("waited %v, want one wait of the rule's second", f.slept)
				}
				if got := f.counters.ruleIDs(); !slices.Equal(got, []string{"slow_down", "slow_down", "tier_free.total"}) {
					t.Fatalf("asked %v; the rule again after the wait, then the rest", got)
				}
				if a, b := f.counters.calls[0].Returned, f.counters.calls[1].Returned; a != 3 || b != 0 {
					t.Fatalf("refunds sent %d then %d; the second ask must not credit them again", a, b)
				}
			} else if len(f.slept) != 0 || resp.RetryAfter != 1 {
				t.Fatalf("past the bound: waited %v, answered %+v", f.slept, resp)
			}
		})
	}
}

// A throttled rule's wait comes out of the lease's time: the counters asked
// before it answered before the wait, and their windows' ends are that
// much nearer (an outsider's leases, granted 70 ms before a window's end
// and throttled into the next, were spent there: 254 admitted of 200).
// A window that ended during the wait leaves no lease at all, and the
// counters take back what they granted.
func TestThrottledLeaseEndsWithItsWindow(t *testing.T) {
	const rule = `
[[rules]]
id = "slow_down"
path = "/**"
scope = "global"
algorithm = "fixed_window"
limit = 12
window_seconds = 1
action = "throttle"
`
	for _, tc := range []struct {
		name    string
		left    time.Duration // of the tier's window when it answered
		wantTTL int64
	}{
		{"the window outlasts the wait", 5 * time.Second, 5000 - 1000 - 1}, // less the millisecond ResetAfter is rounded up by
		{"the window ends during the wait", 700 * time.Millisecond, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, "default_tier = \"flat\"\n[lease]\nfraction = 0.5\nmax = 10\nttl_ms = 60000\n\n[[tiers]]\nname = \"flat\"\nlimit = 50\nwindow_seconds = 60\nalgorithm = \"fixed_window\"\nper_endpoint = false\n"+rule,
				func(c *config.Config) { c.ThrottleMaxWaitMs = 2000 })
			clock := time.Unix(1_800_000_000, 0)
			f.svc.now = func() time.Time { return clock }
			sleep := f.svc.sleep
			f.svc.sleep = func(ctx context.Context, d time.Duration) bool { clock = clock.Add(d); return sleep(ctx, d) }
			f.counters.windowLeft = map[string]time.Duration{"tier_flat": tc.left, "slow_down": time.Minute}
			req := wire.CheckRequest{UserID: "bob", Tier: "flat", Endpoint: "/api/v1/items"}
			for range 12 { // the global rule's second, spent
				f.check(t, req)
			}
			req.Lease = 10
			resp, err := f.check(t, req)
			if err != nil || !resp.Allowed || len(f.slept) != 1 {
				t.Fatalf("a throttled request: %+v %v, slept %v", resp, err, f.slept)
			}
			if resp.Lease.TTLMs != tc.wantTTL || (tc.wantTTL == 0) != (resp.Lease.Granted == 0) {
				t.Fatalf("lease %+v; want a TTL of %d ms (asked %v)", resp.Lease, tc.wantTTL, f.counters.ruleIDs())
			}
			if tc.wantTTL == 0 {
				back := map[string]int64{}
				for _, c := range f.counters.calls[len(f.counters.calls)-2:] {
					back[c.Rule.ID] = c.Returned
				}
				if back["tier_flat"] != 10 || back["slow_down"] != 5 {
					t.Fatalf("given back %v; want each counter's whole grant (10 and 5)", back)
				}
			}
		})
	}
}

// retry_after_jitter spreads refused callers' Retry-After evenly over
// [wait, wait x (1 + jitter)]: never sooner than admitted, no value favoured
// (a chi-square test over the whole seconds it can land on).
func TestRetryAfterJitter(t *testing.T) {
	one, ten := int64(1), int64(10)
	req := wire.CheckRequest{UserID: "u", Endpoint: "/x", Limit: &one, WindowSeconds: &ten}
	f := newFixture(t, "", nil)
	if _, err := f.check(t, req); err != nil {
		t.Fatal(err)
	}
	if r, _ := f.check(t, req); r.Allowed || r.RetryAfter != 10 {
		t.Fatalf("without jitter: %+v, want retry after 10 s", r)
	}
	f = newFixture(t, "retry_after_jitter = 0.5", nil)
	f.svc.rand = rand.New(rand.NewPCG(1, 2)).Float64
	if _, err := f.check(t, req); err != nil {
		t.Fatal(err)
	}
	const n = 5000
	counts := map[int64]int{}
	for range n {
		r, err := f.check(t, req)
		if err != nil || r.Allowed {
			t.Fatalf("%+v %v", r, err)
		}
		if r.RetryAfter < 10 || r.RetryAfter > 15 {
			t.Fatalf("retry after %d s, outside 10..15", r.RetryAfter)
		}
		counts[r.RetryAfter]++
	}
	// 10 + 5U rounded up lands on 11..15, each a fifth of the time.
	chi := 0.0
	for s := int64(11); s <= 15; s++ {
		d := float64(counts[s]) - n/5.0
		chi += d * d / (n / 5.0)
	}
	if chi > 18.47 { // p = 0.001 for 4 degrees of freedom
		t.Fatalf("retry-after spread %v: chi-square %.1f, not uniform", counts, chi)
	}
}

// A rule's own response goes with its denials, not with its admissions nor
// with another rule's denials; in shadow mode none is sent.
func TestRefusalGoesWithTheDenyingRule(t *testing.T) {
	const toml = `
[[rules]]
id = "custom"
path = "/api/*"
scope = "identity"
algorithm = "fixed_window"
limit = 1
window_seconds = 60
[rules.response]
status = 403
body = '{"msg":"over {{limit}}, retry in {{retry_after}}s"}'
headers = {x-why = "quota"}
`
	f := newFixture(t, toml, nil)
	req := wire.CheckRequest{UserID: "u", Endpoint: "/api/x"}
	if r, _ := f.check(t, req); !r.Allowed || r.Refusal != nil {
		t.Fatalf("admitted with a refusal: %+v", r)
	}
	r, _ := f.check(t, req)
	if r.Allowed || r.Refusal == nil || r.Refusal.StatusCode() != 403 || r.Refusal.Headers["x-why"] != "quota" {
		t.Fatalf("denial %+v, refusal %+v", r, r.Refusal)
	}
	if r, _ := f.check(t, wire.CheckRequest{UserID: "u", Endpoint: "/other"}); r.Refusal != nil {
		t.Fatalf("another rule's answer carries the refusal: %+v", r)
	}
	off := newFixture(t, "shadow_mode = true\n"+toml, nil)
	off.check(t, req)
	if r, _ := off.check(t, req); !r.Allowed || !r.LogOnly || r.Refusal != nil {
		t.Fatalf("shadow mode: %+v", r)
	}
}

// A counter that granted more of a lease than another gives the excess
// back and is charged nothing more for it: each counter holds the
// request's cost and the lease the filter got, no more (a hand-back that
// carried the request's cost took a token each: 11 admitted of a tier's
// total of 20 through the gateway).
func TestGiveBackChargesNothing(t *testing.T) {
	f := newFixture(t, `
default_tier = "free"
[lease]
fraction = 0.5
max = 10
ttl_ms = 60000

[[tiers]]
name = "free"
limit = 5
window_seconds = 3600
algorithm = "fixed_window"
total_limit = 100
`, nil)
	resp, err := f.check(t, wire.CheckRequest{UserID: "bob", Endpoint: "/api/v1/items", Lease: 10})
	if err != nil || !resp.Allowed {
		t.Fatalf("%+v %v", resp, err)
	}
	returned := 0
	for _, c := range f.counters.calls {
		if c.Returned > 0 {
			returned++
		}
	}
	if len(f.counters.used) != 2 || returned == 0 {
		t.Fatalf("counters %v, %d hand-backs: want two counters granting unequal leases", f.counters.used, returned)
	}
	for k, used := range f.counters.used {
		if used != 1+resp.Lease.Granted {
			t.Errorf("counter %s holds %d; want the request's 1 and the lease's %d", k, used, resp.Lease.Granted)
		}
	}
}

// A return-only check hands back a lease that ended unspent, to every
// counter that granted it, and spends nothing: an outsider's client asking
// 300 paths three times each spent its tier's total of 1,000 on leases no
// request came back to, refused for the rest of the window with every
// lease expired. It needs the service credential, something to return,
// and no lease of its own.
func TestReturnOnlyHandsBack(t *testing.T) {
	f := newFixture(t, `
default_tier = "free"
[lease]
fraction = 0.5
max = 10
ttl_ms = 60000

[[tiers]]
name = "free"
limit = 50
window_seconds = 3600
algorithm = "fixed_window"
total_limit = 100
`, nil)
	used := func() map[string]int64 { return maps.Clone(f.counters.used) }
	var leases []wire.Lease
	for _, ep := range []string{"/a", "/b"} {
		resp, err := f.check(t, wire.CheckRequest{UserID: "bob", Endpoint: ep, Lease: 10})
		if err != nil || !resp.Allowed {
			t.Fatalf("%s: %+v %v", ep, resp, err)
		}
		if resp.Lease.Granted > 0 {
			leases = append(leases, resp.Lease)
		}
	}
	if len(leases) != 2 {
		t.Fatalf("leases %+v, want one a path", leases)
	}
	before := used()
	for i, ep := range []string{"/a", "/b"} {
		if _, err := f.check(t, wire.CheckRequest{UserID: "bob", Endpoint: ep, Returned: leases[i].Granted - 1, Spent: 1,
			LeasedAt: leases[i].LeasedAt, ReturnOnly: true}); err != nil {
			t.Fatal(err)
		}
	}
	after := used()
	var total string
	for k := range after {
		if strings.Contains(k, "total") {
			total = k
		}
	}
	if want := before[total] - (leases[0].Granted - 1) - (leases[1].Granted - 1); total == "" || after[total] != want {
		t.Fatalf("the total holds %d after the hand-backs, want %d (counters before %v, after %v)", after[total], want, before, after)
	}
	for k, n := range after {
		if n > before[k] {
			t.Errorf("counter %s grew from %d to %d: a return-only check spent", k, before[k], n)
		}
	}
	for _, tc := range []struct {
		name string
		req  wire.CheckRequest
	}{
		{"nothing to return", wire.CheckRequest{UserID: "bob", Endpoint: "/a", ReturnOnly: true}},
		{"a lease asked for", wire.CheckRequest{UserID: "bob", Endpoint: "/a", Returned: 1, Lease: 5, ReturnOnly: true}},
		{"with override_only", wire.CheckRequest{UserID: "bob", Endpoint: "/a", Returned: 1, Method: "POST", MethodOverride: "DELETE", OverrideOnly: true, ReturnOnly: true}},
	} {
		if _, err := f.check(t, tc.req); err == nil {
			t.Errorf("%s: accepted", tc.name)
		}
	}
	if _, err := f.svc.Check(context.Background(), &wire.CheckRequest{UserID: "bob", Endpoint: "/a", ReturnOnly: true}, Untrusted); err == nil {
		t.Error("a return-only check without the service credential was accepted")
	}
}

// Every rule a request matches is charged its own cost, however many
// match: an outsider's policy matched ten (a verified user's scopes, trial
// rules, the tier's two), and the tenth, a budget taking its cost from a
// header, charged 1 a request: 100 requests of 100 units each spent a
// budget of 100.
func TestCostOfEveryMatchedRule(t *testing.T) {
	var toml strings.Builder
	for _, scope := range []string{"user", "ip", "identity", "global"} {
		// An enforced rule and a trial (log_only) of each scope.
		fmt.Fprintf(&toml, "[[rules]]\nid = \"%s_act\"\npath = \"/x/**\"\nscope = \"%s\"\nalgorithm = \"fixed_window\"\nlimit = 100000\nwindow_seconds = 60\n", scope, scope)
		fmt.Fprintf(&toml, "[[rules]]\nid = \"%s_trial\"\npath = \"/x/**\"\nscope = \"%s\"\naction = \"log_only\"\nalgorithm = \"fixed_window\"\nlimit = 100000\nwindow_seconds = 60\n", scope, scope)
	}
	toml.WriteString("[[rules]]\nid = \"budget\"\npath = \"/x/**\"\nscope = \"endpoint\"\nalgorithm = \"fixed_window\"\nlimit = 100\nwindow_seconds = 60\ncost_from = \"request_header:x-units\"\n")
	f := newFixture(t, toml.String(), nil)
	req := wire.CheckRequest{UserID: "user:alice", ClientAddress: "203.0.113.9", Endpoint: "/x/a", CostHeaders: map[string]string{"x-units": "100"}}
	if r, err := f.check(t, req); err != nil || !r.Allowed {
		t.Fatalf("the first 100 units: %+v %v", r, err)
	}
	if rules := f.counters.ruleIDs(); len(rules) <= 8 || rules[len(rules)-1] != "budget" {
		t.Fatalf("asked %v; want more than eight rules, the budget last", rules)
	}
	req.CostHeaders["x-units"] = "1"
	if r, err := f.check(t, req); err != nil || r.Allowed || r.RuleID != "budget" {
		t.Fatalf("a unit past the budget of 100: %+v %v; want refused by budget", r, err)
	}
}

// A rule's cost_from takes each request's cost from the request: a header's
// integer or the body's size, never less than 1, never a lease (each such
// request is counted here), and bad or unknown values refused with their
// field named before anything is spent.
func TestCostFromTheRequest(t *testing.T) {
	const toml = `
[[rules]]
id = "tokens"
path = "/llm/*"
scope = "identity"
algorithm = "fixed_window"
limit = 100
window_seconds = 60
cost_from = "request_header:x-tokens"
[[rules]]
id = "upload"
path = "/upload"
scope = "identity"
algorithm = "fixed_window"
limit = 1000
window_seconds = 60
cost_from = "request_body_bytes"
`
	f := newFixture(t, toml, nil)
	llm := func(h map[string]string) wire.CheckRequest {
		return wire.CheckRequest{UserID: "u", Endpoint: "/llm/chat", CostHeaders: h, Lease: 10}
	}
	for _, step := range []struct {
		headers   map[string]string
		allowed   bool
		remaining int64
	}{
		{map[string]string{"x-tokens": "40"}, true, 60},
		{map[string]string{"x-tokens": "0"}, true, 59}, // never free
		{nil, true, 58}, // absent: the rule's cost, 1
		{map[string]string{"x-tokens": "70"}, false, 58},
		{map[string]string{"x-tokens": "58"}, true, 0},
	} {
		r, err := f.check(t, llm(step.headers))
		if err != nil || r.Allowed != step.allowed || r.Remaining != step.remaining || r.Lease.Granted != 0 {
			t.Fatalf("%v: %+v %v; want allowed %v, %d left, no lease", step.headers, r, err, step.allowed, step.remaining)
		}
	}
	for _, bad := range []struct {
		req   wire.CheckRequest
		field string
	}{
		{llm(map[string]string{"x-tokens": "12abc"}), `cost_headers["x-tokens"]`},
		{llm(map[string]string{"X-Tokens": "100"}), `cost_headers["X-Tokens"]`}, // read as absent, it would cost 1
		{llm(map[string]string{"x-tokens": "-5"}), `cost_headers["x-tokens"]`},
		{llm(map[string]string{"x-tokens": "101"}), "cost"},
		{wire.CheckRequest{UserID: "u", Endpoint: "/upload"}, "body_bytes"},
		{wire.CheckRequest{UserID: "u", Endpoint: "/upload", BodyBytes: ptr(int64(-1))}, "body_bytes"},
		{wire.CheckRequest{UserID: "u", Endpoint: "/upload", BodyBytes: ptr(int64(5000))}, "cost"},
		{wire.CheckRequest{UserID: "u", Endpoint: "/x", CostHeaders: map[string]string{"a": "", "b": "", "c": "", "d": "", "e": "", "f": "", "g": "", "h": "", "i": ""}}, "cost_headers"},
	} {
		_, err := f.check(t, bad.req)
		var ae *apierr.Error
		if !errors.As(err, &ae) || ae.Details["field"] != bad.field {
			t.Errorf("%+v: %v; want a refusal naming %s", bad.req, err, bad.field)
		}
	}
	if r, err := f.check(t, wire.CheckRequest{UserID: "u", Endpoint: "/upload", BodyBytes: ptr(int64(600))}); err != nil || !r.Allowed || r.Remaining != 400 {
		t.Fatalf("600 bytes: %+v %v", r, err)
	}
	if r, _ := f.check(t, wire.CheckRequest{UserID: "u", Endpoint: "/upload", BodyBytes: ptr(int64(500))}); r.Allowed {
		t.Fatalf("500 bytes more admitted past 1000: %+v", r)
	}
}

func ptr[T any](v T) *T { return &v }

// A violation keeps at most 256 bytes of the client's endpoint: a caller
// refused at its limit cannot fill the trail with 8 KiB paths.
func TestViolationEventsAreBounded(t *testing.T) {
	f := newFixture(t, "", nil)
	one, sixty := int64(1), int64(60)
	long := "/" + strings.Repeat("p", 5000)
	req := wire.CheckRequest{UserID: "u", Endpoint: long, Limit: &one, WindowSeconds: &sixty}
	f.check(t, req)
	if r, _ := f.check(t, req); r.Allowed {
		t.Fatal("second check admitted")
	}
	if n := len(f.usage.events); n != 1 || len(f.usage.events[0].Endpoint) != 259 || !strings.HasSuffix(f.usage.events[0].Endpoint, "...") {
		t.Fatalf("violation events %d, endpoint of %d bytes", n, len(f.usage.events[0].Endpoint))
	}
}

// An override-only check needs an override other than the method, counts
// configured rules (no limit of its own), and takes no lease.
func TestOverrideOnlyInputs(t *testing.T) {
	f := newFixture(t, model, nil)
	limit := int64(5)
	for _, tt := range []struct {
		req   wire.CheckRequest
		field string
	}{
		{wire.CheckRequest{UserID: "alice", Endpoint: "/x", Method: "POST", OverrideOnly: true}, "override_only"},
		{wire.CheckRequest{UserID: "alice", Endpoint: "/x", Method: "POST", MethodOverride: "POST", OverrideOnly: true}, "override_only"},
		{wire.CheckRequest{UserID: "alice", Endpoint: "/x", Method: "POST", MethodOverride: "DELETE", OverrideOnly: true, Limit: &limit}, "override_only"},
		{wire.CheckRequest{UserID: "alice", Endpoint: "/x", Method: "POST", MethodOverride: "delete", OverrideOnly: true}, "method_override"},
	} {
		_, err := f.svc.Check(context.Background(), &tt.req, Trusted)
		var ae *apierr.Error
		if !errors.As(err, &ae) || !strings.HasPrefix(ae.Message, "invalid "+tt.field+":") {
			t.Errorf("%+v: %v, want a refusal naming %s", tt.req, err, tt.field)
		}
	}
	resp, err := f.check(t, wire.CheckRequest{UserID: "alice", Endpoint: "/api/v1/uploads/big", Method: "POST", MethodOverride: "DELETE", OverrideOnly: true, Lease: 10})
	if err != nil || !resp.Allowed || resp.Lease.Granted != 0 || resp.RuleID != "uploads_delete" {
		t.Fatalf("%+v %v, want uploads_delete's answer without a lease", resp, err)
	}
}
