package hostmodel

import (
	"testing"

	"github.com/tollgate-rl/tollgate/filter/proxywasm/abi"
)

// Shared data as cpp-host keeps it: a CAS guards an existing entry only.
func TestSharedDataCAS(t *testing.T) {
	var d SharedData
	if _, _, ok := d.Get("k"); ok {
		t.Fatal("missing key found")
	}
	if st := d.Set("k", []byte("a"), 42); st != abi.StatusOK {
		t.Fatalf("a CAS on a missing key inserts in Envoy; got status %d", st)
	}
	v, cas, ok := d.Get("k")
	if !ok || string(v) != "a" || cas == 0 {
		t.Fatalf("get %q %d %v", v, cas, ok)
	}
	if st := d.Set("k", []byte("b"), cas+1); st != abi.StatusCasMismatch {
		t.Fatalf("stale CAS: status %d", st)
	}
	if st := d.Set("k", []byte("b"), cas); st != abi.StatusOK {
		t.Fatalf("current CAS: status %d", st)
	}
	if st := d.Set("k", []byte("c"), 0); st != abi.StatusOK {
		t.Fatalf("CAS 0 always writes: status %d", st)
	}
	v[0] = 'x' // a returned value is a copy
	if again, _, _ := d.Get("k"); string(again) != "c" {
		t.Fatalf("value %q", again)
	}
}

// Metrics as Envoy keeps them: counters only grow.
func TestMetricsRules(t *testing.T) {
	var ms Metrics
	c, _ := ms.Define(abi.MetricCounter, "c")
	g, _ := ms.Define(abi.MetricGauge, "g")
	hist, _ := ms.Define(abi.MetricHistogram, "h")
	if again, _ := ms.Define(abi.MetricCounter, "c"); again != c {
		t.Fatal("a metric defined twice got two ids")
	}
	if _, st := ms.Define(9, "x"); st != abi.StatusBadArgument {
		t.Fatal("unknown kind accepted")
	}
	for _, tc := range []struct {
		id     uint32
		offset int64
		want   abi.Status
	}{{c, 2, abi.StatusOK}, {c, 0, abi.StatusBadArgument}, {c, -1, abi.StatusBadArgument}, {g, -5, abi.StatusOK}, {hist, 1, abi.StatusBadArgument}, {99, 1, abi.StatusNotFound}} {
		if st := ms.Increment(tc.id, tc.offset); st != tc.want {
			t.Errorf("increment %d by %d: status %d, want %d", tc.id, tc.offset, st, tc.want)
		}
	}
	ms.Record(hist, 7)
	if ms.Value("c") != 2 || ms.Value("g") != -5 || len(ms.Samples("h")) != 1 {
		t.Fatalf("c %d g %d h %v", ms.Value("c"), ms.Value("g"), ms.Samples("h"))
	}
}
