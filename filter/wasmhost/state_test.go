package wasmhost

import "testing"

// Shared data as cpp-host keeps it: a CAS guards an existing entry only.
func TestSharedDataCAS(t *testing.T) {
	var d SharedData
	if _, _, ok := d.Get("k"); ok {
		t.Fatal("missing key found")
	}
	if st := d.Set("k", []byte("a"), 42); st != stOK {
		t.Fatalf("a CAS on a missing key inserts in Envoy; got status %d", st)
	}
	v, cas, ok := d.Get("k")
	if !ok || string(v) != "a" || cas == 0 {
		t.Fatalf("get %q %d %v", v, cas, ok)
	}
	if st := d.Set("k", []byte("b"), cas+1); st != stCasMismatch {
		t.Fatalf("stale CAS: status %d", st)
	}
	if st := d.Set("k", []byte("b"), cas); st != stOK {
		t.Fatalf("current CAS: status %d", st)
	}
	if st := d.Set("k", []byte("c"), 0); st != stOK {
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
	c, _ := ms.Define(metricCounter, "c")
	g, _ := ms.Define(metricGauge, "g")
	hist, _ := ms.Define(metricHistogram, "h")
	if again, _ := ms.Define(metricCounter, "c"); again != c {
		t.Fatal("a metric defined twice got two ids")
	}
	if _, st := ms.Define(9, "x"); st != stBadArgument {
		t.Fatal("unknown kind accepted")
	}
	for _, tc := range []struct {
		id     uint32
		offset int64
		want   uint32
	}{{c, 2, stOK}, {c, 0, stBadArgument}, {c, -1, stBadArgument}, {g, -5, stOK}, {hist, 1, stBadArgument}, {99, 1, stNotFound}} {
		if st := ms.Increment(tc.id, tc.offset); st != tc.want {
			t.Errorf("increment %d by %d: status %d, want %d", tc.id, tc.offset, st, tc.want)
		}
	}
	ms.Record(hist, 7)
	if ms.Value("c") != 2 || ms.Value("g") != -5 || len(ms.Samples("h")) != 1 {
		t.Fatalf("c %d g %d h %v", ms.Value("c"), ms.Value("g"), ms.Samples("h"))
	}
}
