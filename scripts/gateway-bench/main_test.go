package main

import (
	"strings"
	"testing"
)

func TestDecidedRefusesADegradedLoad(t *testing.T) {
	for _, tc := range []struct {
		name             string
		degraded, failed int64
		want             string
	}{
		{"every request decided", 0, 0, ""},
		{"a wrong decision token: every request degraded", 20000, 32, "did not decide 20000 of 20000"},
		{"a callout failed, its request retried", 0, 1, "1 callouts failed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			counters := map[string]int64{"tollgate_degraded_total": tc.degraded, "tollgate_callout_failures_total": tc.failed}
			err := decided(func(name string) int64 { return counters[name] }, 20000)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "-decision-token") {
				t.Fatalf("got %v, want an error with %q that names -decision-token", err, tc.want)
			}
		})
	}
}
