package wire

import (
	"encoding/json"
	"github.com/tollgate-rl/tollgate/shared/rules"
	"reflect"
	"testing"
)

// FuzzAppendCheckResponse: the hand-written encoder writes exactly what
// json.Marshal writes, whatever the strings and numbers.
func FuzzAppendCheckResponse(f *testing.F) {
	f.Add(true, int64(100), int64(0), int64(7), "token_bucket", "tier_free", "user:a<b>&\"c\"\n\u2028", "free", false)
	f.Add(false, int64(-1), int64(3), int64(1<<62), "", "", "\xff\x00\b\f", "", true)
	f.Fuzz(func(t *testing.T, allowed bool, limit, quota, remaining int64, strategy, rule, id, tier string, flag bool) {
		d := CheckResponse{Allowed: allowed, Limit: limit, Quota: quota, Remaining: remaining, ResetAt: limit ^ remaining,
			RetryAfter: quota, Strategy: strategy, WindowSeconds: remaining, RuleID: rule, Lease: Lease{Granted: limit, TTLMs: quota, ChargeGranted: remaining, LeasedAt: limit ^ quota, ChargeLeasedAt: quota ^ remaining},
			Identity: id, Tier: tier, Degraded: flag, LogOnly: !flag && allowed}
		if allowed && flag {
			d.Charges = []Charge{{RuleID: rule, CostFrom: strategy}, {RuleID: tier}}
		}
		if !allowed {
			d.Refusal = &rules.Response{Status: int(quota % 1000), Body: id}
			if flag {
				d.Refusal.Headers = map[string]string{strategy: tier, rule: id}
			}
		}
		want, err := json.Marshal(&d)
		if err != nil {
			t.Fatal(err)
		}
		if got := AppendCheckResponse(nil, &d); string(got) != string(want) {
			t.Fatalf("\n got %s\nwant %s", got, want)
		}
	})
}

func BenchmarkAppendCheckResponse(b *testing.B) {
	d := CheckResponse{Allowed: true, Limit: 100, Remaining: 42, ResetAt: 1735689720, Strategy: "token_bucket", WindowSeconds: 60,
		RuleID: "tier_free", Lease: Lease{Granted: 10, TTLMs: 1000}, Identity: "user:alice", Tier: "free"}
	b.Run("wire", func(b *testing.B) {
		b.ReportAllocs()
		buf := make([]byte, 0, 512)
		for b.Loop() {
			buf = AppendCheckResponse(buf[:0], &d)
		}
	})
	b.Run("encoding/json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := json.Marshal(&d); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// FuzzAppendCheckRequest: the callout encoder writes exactly what
// json.Marshal writes, and the service's decoder reads back what was
// written.
func FuzzAppendCheckRequest(f *testing.F) {
	f.Add("user:a<b>&\"c\"", "/api/v1/items", "GET", "", int64(0), false, "premium", "acme", "ak_live_x", int64(0), int64(10), int64(3), "192.0.2.1")
	f.Add("", "", "", "gcra", int64(-5), true, "", "", "", int64(7), int64(0), int64(0), "\xff\x00\u2028")
	f.Fuzz(func(t *testing.T, user, endpoint, method, strategy string, limit int64, hasLimit bool, tier, tenant, key string, cost, lease, returned int64, address string) {
		r := CheckRequest{UserID: user, Endpoint: endpoint, Method: method, Strategy: strategy, Tier: tier, Tenant: tenant, APIKey: key,
			Cost: cost, Lease: lease, Returned: returned, Spent: returned ^ lease, ClientAddress: address, MethodOverride: strategy + method,
			LeaseCharges: hasLimit != (cost > 0), ChargeReturned: cost ^ returned, LeasedAt: lease ^ cost, ChargeLeasedAt: lease ^ returned, OverrideOnly: lease > returned, ReturnOnly: cost > lease}
		if hasLimit {
			r.Limit, r.WindowSeconds = &limit, &cost
			r.BodyBytes = &lease
			r.CostHeaders = map[string]string{tier: tenant, key: address}
		}
		want, err := json.Marshal(&r)
		if err != nil {
			t.Fatal(err)
		}
		got := AppendCheckRequest(nil, &r)
		if string(got) != string(want) {
			t.Fatalf("\n got %s\nwant %s", got, want)
		}
		var back, theirs CheckRequest
		if err := json.Unmarshal(got, &theirs); err != nil {
			t.Fatal(err)
		}
		if DecodeCheckRequest(got, &back) == nil && !reflect.DeepEqual(back, theirs) {
			t.Fatalf("read back %+v, encoding/json %+v", back, theirs)
		}
	})
}
