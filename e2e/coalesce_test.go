package e2e

import (
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/filter/devhost/gateway"
	"github.com/tollgate-rl/tollgate/shared/wire"
	"github.com/tollgate-rl/tollgate/testkit/redistest"
)

// A bucket's refill through the gateway's two VMs costs one check: while
// the first request's callout is held on its way to the control service,
// the caller's requests on both VMs wait for it (the other VM's tick loop
// looks again every millisecond), and all are admitted from the lease it
// brings.
func TestRefillCoalescesAcrossVMsThroughTheGateway(t *testing.T) {
	r := redistest.Start(t)
	ctl := startControl(t, r.Addr, `
[lease]
fraction = 0.5
max = 10
ttl_ms = 60000
[[tiers]]
name = "free"
limit = 1000
window_seconds = 3600
per_endpoint = false
`)
	// gate passes checks on to the control service, holding the first
	// until released.
	var checks atomic.Int64
	arrived, release := make(chan struct{}), make(chan struct{})
	ctlURL, _ := url.Parse("http://" + ctl.addr)
	pass := httputil.NewSingleHostReverseProxy(ctlURL)
	gate := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == wire.PathCheck && checks.Add(1) == 1 {
			close(arrived)
			select {
			case <-release:
			case <-r.Context().Done():
				return
			}
		}
		pass.ServeHTTP(w, r)
	}))
	t.Cleanup(gate.Close)
	gateURL, _ := url.Parse(gate.URL)
	up := newUpstream(t)
	upURL, _ := url.Parse(up.URL)
	gw, g := serveGatewayOf(t, gateway.Config{
		Wasm: wasmBytes, Upstream: upURL, Clusters: map[string]*url.URL{"controlsvc": gateURL}, VMs: 2, CompilationCache: compCache,
		PluginConfig: []byte(`{"control_cluster":"controlsvc","decision_token":"` + decisionToken + `","timeout_ms":10000,"lease":{"request":10}}`),
	})

	const followers = 5
	statuses := make(chan int, followers+1)
	call := func() {
		res, err := tryGet(gw, "/api/v1/items", "X-Forwarded-For", "203.0.113.90")
		if err != nil {
			t.Error(err)
		}
		statuses <- res.status
	}
	go call()
	<-arrived
	var wg sync.WaitGroup
	for range followers {
		wg.Add(1)
		go func() { defer wg.Done(); call() }()
	}
	// Each follower waits, on its VM's refill or the other's: the signal
	// the gate is released on.
	deadline := time.Now().Add(30 * time.Second)
	for g.Host().Counter("tollgate_refill_waits_total") < followers {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d requests wait for the refill", g.Host().Counter("tollgate_refill_waits_total"), followers)
		}
		time.Sleep(time.Millisecond)
	}
	close(release)
	wg.Wait()
	for range followers + 1 {
		if s := <-statuses; s != http.StatusOK {
			t.Fatalf("status %d", s)
		}
	}
	if n := checks.Load(); n != 1 {
		t.Fatalf("%d checks for one refill, want 1", n)
	}
	if hits := g.Host().Counter("tollgate_lease_hits_total"); hits != followers {
		t.Fatalf("%d lease hits, want %d", hits, followers)
	}
}
