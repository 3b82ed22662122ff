package e2e

import (
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/filter/devhost/gateway"
	"github.com/tollgate-rl/tollgate/testkit/redistest"
)

// Leases that end with tokens left go back to the counters that granted
// them, though no request comes back to their buckets: an outsider's
// client asking 300 paths three times each got 300 of its tier's total of
// 1,000 and was refused for the rest of the minute, every lease long
// expired. Here a caller walks 20 paths three times each (each path's
// second check takes a lease from the path's counter and from the total),
// then asks new paths once each: once the leases end it gets the whole
// total of 60, never more.
func TestEndedLeasesGiveTheTotalBack(t *testing.T) {
	r := redistest.Start(t)
	ctl := startControl(t, r.Addr, `
[lease]
fraction = 0.5
max = 10
ttl_ms = 500
[[tiers]]
name = "free"
limit = 20
window_seconds = 3600
algorithm = "fixed_window"
total_limit = 60
`)
	up := newUpstream(t)
	upURL, _ := url.Parse(up.URL)
	ctlURL, _ := url.Parse("http://" + ctl.addr)
	gw, g := serveGatewayOf(t, gateway.Config{
		Wasm: wasmBytes, PluginConfig: []byte(`{"control_cluster":"controlsvc","decision_token":"` + decisionToken + `","timeout_ms":2000,"lease":{"request":10}}`),
		Upstream: upURL, Clusters: map[string]*url.URL{"controlsvc": ctlURL}, VMs: 1, CompilationCache: compCache, XFFTrustedHops: 1,
	})
	admitted := 0
	ask := func(path string) {
		t.Helper()
		if res := get(t, gw, path, "X-Forwarded-For", "203.0.113.90"); res.status == 200 {
			admitted++
		} else if res.status != 429 {
			t.Fatalf("%s: %d", path, res.status)
		}
	}
	for i := range 20 {
		for range 3 {
			ask(fmt.Sprintf("/api/v1/walk/%d", i))
		}
	}
	walked := admitted
	if g.Host().Counter("tollgate_lease_hits_total") == 0 {
		t.Fatal("no request was answered from a lease: the walk took none")
	}
	// New paths, one request each (a bucket's first check takes no lease):
	// what the total has left, counted exactly, as the ended leases come
	// back.
	deadline := time.Now().Add(10 * time.Second)
	for i := 0; admitted < 60 && time.Now().Before(deadline); i++ {
		ask(fmt.Sprintf("/api/v1/new/%d", i))
		if admitted < 60 {
			time.Sleep(20 * time.Millisecond) // a lease ends 500 ms after its grant; a tick hands it back within 200 ms
		}
	}
	for i := range 20 { // and not one more
		ask(fmt.Sprintf("/api/v1/more/%d", i))
	}
	if admitted != 60 {
		t.Fatalf("admitted %d of a total of 60 (%d walking 20 paths, %d hand-backs sent)", admitted, walked, g.Host().Counter("tollgate_lease_returns_total"))
	}
	if up.count() != admitted {
		t.Fatalf("upstream saw %d requests, %d were admitted", up.count(), admitted)
	}
	if n := g.Host().Counter("tollgate_lease_returns_total"); n == 0 {
		t.Fatal("no lease was handed back")
	}
	t.Logf("admitted %d walking 20 paths three times, %d in all; %d hand-backs", walked, admitted, g.Host().Counter("tollgate_lease_returns_total"))
}
