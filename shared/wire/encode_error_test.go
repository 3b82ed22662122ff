//go:build !wasip1

package wire

import (
	"encoding/json"
	"testing"
)

// FuzzAppendErrorEnvelope: the hand-written envelope is byte for byte what
// json.Marshal writes for an ErrorEnvelope, whatever the strings and the
// details of the types errors carry.
func FuzzAppendErrorEnvelope(f *testing.F) {
	f.Add(CodeRateLimitExceeded, "You have exceeded <the> limit & \"more\"", "req-1", "limit", int64(100), "x\u2028\xff", true, 2)
	f.Add("", "", "", "", int64(-1), "", false, 0)
	f.Fuzz(func(t *testing.T, code, msg, rid, key string, n int64, s string, flag bool, shape int) {
		b := ErrorBody{Code: code, Message: msg, RequestID: rid}
		switch shape % 4 {
		case 1:
			b.Details = map[string]any{}
		case 2:
			b.Details = map[string]any{key: n, key + "s": s, key + "b": flag, key + "i": int(n), key + "l": []string{s, key}, key + "n": nil}
		case 3:
			b.Details = map[string]any{"reset_at": s, "retry_after_seconds": n}
		}
		want, err := json.Marshal(ErrorEnvelope{Error: b})
		if err != nil {
			t.Fatal(err)
		}
		if got := AppendErrorEnvelope(nil, &b); string(got) != string(want) {
			t.Fatalf("\n got %s\nwant %s", got, want)
		}
	})
}

func BenchmarkAppendErrorEnvelope(b *testing.B) {
	e := Exceeded(&Limits{Limit: 100, WindowSeconds: 60, ResetAt: 1_800_000_000, RetryAfter: 12})
	e.RequestID = "3f0c6a1e-8d2b-4c55-9a77-1b2c3d4e5f60"
	b.Run("wire", func(b *testing.B) {
		b.ReportAllocs()
		buf := make([]byte, 0, 512)
		for b.Loop() {
			buf = AppendErrorEnvelope(buf[:0], &e)
		}
	})
	b.Run("encoding/json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := json.Marshal(ErrorEnvelope{Error: e}); err != nil {
				b.Fatal(err)
			}
		}
	})
}
