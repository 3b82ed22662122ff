package wire

import (
	"encoding/json"
	"testing"
)

// FuzzAppendCheckResponse: the hand-written encoder writes exactly what
// json.Marshal writes, whatever the strings and numbers.
func FuzzAppendCheckResponse(f *testing.F) {
	f.Add(true, int64(100), int64(0), int64(7), "token_bucket", "tier_free", "user:a<b>&\"c\"\n\u2028", "free", false)
	f.Add(false, int64(-1), int64(3), int64(1<<62), "", "", "\xff\x00\b\f", "", true)
	f.Fuzz(func(t *testing.T, allowed bool, limit, quota, remaining int64, strategy, rule, id, tier string, flag bool) {
		d := CheckResponse{Allowed: allowed, Limit: limit, Quota: quota, Remaining: remaining, ResetAt: limit ^ remaining,
			RetryAfter: quota, Strategy: strategy, WindowSeconds: remaining, RuleID: rule, Lease: Lease{Granted: limit, TTLMs: quota},
			Identity: id, Tier: tier, Degraded: flag, LogOnly: !flag && allowed}
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
