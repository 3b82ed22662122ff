package filtertest

import (
	"context"
	"strings"
	"testing"

	"github.com/tollgate-rl/tollgate/filter/devhost/wasmhost"
)

// A million requests through one VM under each Envoy's WASI (TestMain runs
// the suite under both), with a spike of large headers every thousandth
// request and a callout whenever the lease runs out: guest memory stops
// growing, and the VM lives through its garbage collections without ever
// calling poll_oneoff, which Envoy 1.33-1.38 fail and Go's runtime dies of
// (newEnv's cleanup asserts no call; TestNothingArmsATimer keeps the causes
// out of the module).
func TestSoakOneVM(t *testing.T) {
	const requests = 1_000_000
	e := newEnv(t, `{"control_cluster":"controlsvc","lease":{"request":1000}}`, 1)
	vm := e.vms[0]
	gcBefore := vm.GCCycles()
	if n := soak(t, vm, requests); n != requests {
		t.Fatalf("the VM died after %d requests under %v: %v", n, envoyWASI, vm.Broken())
	}
	if n := e.host.Counter("tollgate_allowed_total"); n != requests {
		t.Fatalf("%d allowed of %d", n, requests)
	}
	gcs := vm.GCCycles() - gcBefore
	if gcs < 100 {
		t.Fatalf("only %d garbage collections in the soak: it no longer tests the VM through many", gcs)
	}
	t.Logf("%v: %d garbage collections, poll_oneoff calls %d", envoyWASI, gcs, vm.HostCalls("poll_oneoff"))
}

// soak sends up to n requests through vm and returns how many it served
// before the VM broke.
func soak(t testing.TB, vm *wasmhost.VM, requests int) int {
	t.Helper()
	ctx := context.Background()
	answer := []byte(decision(true, 1<<30, 1000, 0))
	big := wasmhost.Headers{{"x-forwarded-for", strings.Repeat("9.9.9.9,", 1200)}, {"cookie", strings.Repeat("c", 16<<10)},
		{"authorization", "Bearer " + strings.Repeat("a", 8<<10)}, {"x-tollgate-forged", "1"}}
	base := wasmhost.Headers{{":method", "GET"}, {":path", "/api/v1/items"}, {":authority", "api"}, {":scheme", "http"}}
	props := map[string]string{"source.address": "198.51.100.7:4000"}
	var memAt200k uint32
	for i := 1; i <= requests; i++ {
		h := base
		if i%1000 == 0 {
			h = append(append(wasmhost.Headers{}, base...), big...)
		}
		s, err := vm.NewStream(ctx, h, props)
		if err != nil {
			// The VM may die in any callback that allocates, context
			// creation too: where depends on when its collections fall.
			if vm.Broken() != nil {
				return i - 1
			}
			t.Fatal(err)
		}
		act, err := s.OnRequestHeaders(ctx, true)
		if err != nil {
			if vm.Broken() != nil {
				return i - 1
			}
			t.Fatalf("request %d: %v", i, err)
		}
		if act == wasmhost.Pause && s.Local == nil {
			for _, c := range vm.PendingCallouts() {
				if err := vm.Respond(ctx, c.Token, wasmhost.CalloutResponse{Headers: wasmhost.Headers{{":status", "200"}}, Body: answer}); err != nil {
					if vm.Broken() != nil {
						return i - 1
					}
					t.Fatal(err)
				}
			}
		}
		if !s.Resumed && act != wasmhost.Continue {
			t.Fatalf("request %d was not let through", i)
		}
		if _, err := s.OnResponseHeaders(ctx, wasmhost.Headers{{":status", "200"}}, true); err != nil {
			if vm.Broken() != nil {
				return i - 1
			}
			t.Fatal(err)
		}
		if err := s.Done(ctx); err != nil {
			if vm.Broken() != nil {
				return i
			}
			t.Fatal(err)
		}
		if i == 200_000 {
			memAt200k = vm.MemorySize()
		}
	}
	if requests > 200_000 {
		mem := vm.MemorySize()
		t.Logf("guest memory: %d MiB after 200k requests, %d MiB after %d", memAt200k>>20, mem>>20, requests)
		if mem > 64<<20 || mem > memAt200k+8<<20 {
			t.Fatalf("guest memory grew to %d MiB (%d MiB at 200k requests)", mem>>20, memAt200k>>20)
		}
	}
	return requests
}

// BenchmarkMemoryAfter100k is the guest memory of one VM after 100,000
// requests (lease hits, callouts, spikes of large headers), for the report.
func BenchmarkMemoryAfter100k(b *testing.B) {
	for b.Loop() {
		_, vm := benchVM(b, `{"control_cluster":"controlsvc","lease":{"request":1000}}`)
		if n := soak(b, vm, 100_000); n != 100_000 {
			b.Fatalf("the VM died after %d requests", n)
		}
		b.ReportMetric(float64(vm.MemorySize()), "vm-memory-bytes")
	}
}

// The heap swinging: requests with 1 to 5 MiB of headers in bursts, then
// quiet, so the heap grows and shrinks again and again. That gives Go's
// scavenger free memory to return, and a scavenger that sleeps arms the
// runtime's own timer (which TestNothingArmsATimer cannot see): the VM must
// still never poll, under either WASI.
func TestSoakHeapSwings(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, `{"control_cluster":"controlsvc","lease":{"request":1000}}`, 1)
	vm := e.vms[0]
	answer := []byte(decision(true, 1<<30, 1000, 0))
	base := wasmhost.Headers{{":method", "GET"}, {":path", "/api/v1/items"}, {":authority", "api"}, {":scheme", "http"}}
	props := map[string]string{"source.address": "198.51.100.7:4000"}
	const requests = 300_000
	for i := 1; i <= requests; i++ {
		h := base
		if i%1000 == 0 && (i/1000)%7 < 2 {
			h = append(append(wasmhost.Headers{}, base...), wasmhost.Headers{{"cookie", strings.Repeat("c", (i%5+1)<<20)}}...)
		}
		s, err := vm.NewStream(ctx, h, props)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		act, err := s.OnRequestHeaders(ctx, true)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if act == wasmhost.Pause && s.Local == nil {
			for _, c := range vm.PendingCallouts() {
				if err := vm.Respond(ctx, c.Token, wasmhost.CalloutResponse{Headers: wasmhost.Headers{{":status", "200"}}, Body: answer}); err != nil {
					t.Fatalf("request %d: %v", i, err)
				}
			}
		}
		if err := s.Done(ctx); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
	}
	if gcs := vm.GCCycles(); gcs < 50 {
		t.Fatalf("only %d garbage collections: the heap no longer swings", gcs)
	}
	if mem := vm.MemorySize(); mem > 64<<20 {
		t.Fatalf("guest memory grew to %d MiB", mem>>20)
	}
	t.Logf("%v: %d garbage collections, %d MiB of guest memory, poll_oneoff calls %d", envoyWASI, vm.GCCycles(), vm.MemorySize()>>20, vm.HostCalls("poll_oneoff"))
}

// TestGCUnderHeldRequests holds thousands of requests on callouts (a slow
// control service), answers them in one burst, then serves lease hits. Left
// to Go's own pacing, the collection that started in the burst waited for
// a background mark worker the reactor never ran again: no cycle ended and
// the guest grew by every request's garbage (100 MB after 100,000 lease
// hits); letting that worker run woke the scavenger, whose timer started
// the poller that Envoy 1.33-1.38 refuse. The binding now collects at the
// end of event-loop callbacks (proxywasm/gc_wasip1.go).
func TestGCUnderHeldRequests(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, `{"control_cluster":"controlsvc","lease":{"request":1000}}`, 1)
	vm := e.vms[0]
	grant := wasmhost.CalloutResponse{Headers: wasmhost.Headers{{":status", "200"}}, Body: []byte(decision(true, 1<<30, 1000, 0))}
	answerAll := func() {
		t.Helper()
		for _, c := range vm.PendingCallouts() {
			if err := vm.Respond(ctx, c.Token, grant); err != nil {
				t.Fatalf("answer: %v (VM: %v)", err, vm.Broken())
			}
		}
	}
	const held = 7000
	streams := make([]*wasmhost.Stream, 0, held)
	for i := 0; i < held; i++ {
		s, err := vm.NewStream(ctx, benchReq, benchProps)
		if err != nil {
			t.Fatalf("held request %d: %v", i, err)
		}
		if _, err := s.OnRequestHeaders(ctx, true); err != nil {
			t.Fatalf("held request %d: %v", i, err)
		}
		streams = append(streams, s)
	}
	if n := len(vm.PendingCallouts()); n < held/2 {
		t.Fatalf("only %d of %d requests wait on a callout: the test no longer holds them", n, held)
	}
	answerAll()
	for _, s := range streams {
		if _, err := s.OnResponseHeaders(ctx, wasmhost.Headers{{":status", "200"}}, true); err != nil {
			t.Fatal(err)
		}
		if err := s.Done(ctx); err != nil {
			t.Fatal(err)
		}
	}
	gcBefore := vm.GCCycles()
	const requests = 100_000
	for i := 0; i < requests; i++ {
		s, err := vm.NewStream(ctx, benchReq, benchProps)
		if err != nil {
			t.Fatalf("request %d: %v (VM: %v)", i, err, vm.Broken())
		}
		act, err := s.OnRequestHeaders(ctx, true)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if act != wasmhost.Continue {
			answerAll()
		}
		if err := s.Done(ctx); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
	}
	gcs := vm.GCCycles() - gcBefore
	if gcs < 10 {
		t.Errorf("%d garbage collections in %d requests after the burst: the collector stopped", gcs, requests)
	}
	if mem := vm.MemorySize(); mem > 48<<20 {
		t.Errorf("guest memory grew to %d MiB", mem>>20)
	}
	t.Logf("%v: %d garbage collections after the burst, %d MiB of guest memory", envoyWASI, gcs, vm.MemorySize()>>20)
}
