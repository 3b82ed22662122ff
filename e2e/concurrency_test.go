package e2e

import (
	"sync"
	"testing"

	"github.com/tollgate-rl/tollgate/testkit/redistest"
)

// The filter never admits a request whose token was not consumed in Redis:
// 300 concurrent requests of one caller against a limit of 100, through the
// gateway's VMs sharing leases, admit at most 100 (and lose at most a few
// leased tokens to slot races, which only under-admits).
func TestNoOverAdmissionWithLeases(t *testing.T) {
	r := redistest.Start(t)
	ctl := startControl(t, r.Addr, `
[lease]
fraction = 0.2
max = 10
ttl_ms = 60000
[[tiers]]
name = "free"
limit = 100
window_seconds = 3600
algorithm = "fixed_window"
`)
	up := newUpstream(t)
	gw := startGateway(t, ctl, up, `{"control_cluster":"controlsvc","decision_token":"`+decisionToken+`","timeout_ms":2000,"lease":{"request":10}}`)
	var mu sync.Mutex
	codes := map[int]int{}
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := 0; i < 300; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			res, err := tryGet(gw, "/api/v1/items", "X-Forwarded-For", "203.0.113.77")
			if err != nil {
				t.Error(err) // not Fatal: this is not the test's goroutine
			}
			mu.Lock()
			codes[res.status]++
			mu.Unlock()
		}()
	}
	close(start)
	wg.Wait()
	if codes[200]+codes[429] != 300 {
		t.Fatalf("statuses %v; want only 200 and 429", codes)
	}
	if codes[200] > 100 {
		t.Fatalf("%d admitted against a limit of 100: over-admission", codes[200])
	}
	if codes[200] < 80 {
		t.Fatalf("only %d admitted of 100: leases lost too much", codes[200])
	}
	if up.count() != codes[200] {
		t.Fatalf("upstream saw %d requests, %d were admitted", up.count(), codes[200])
	}
	t.Logf("admitted %d of 100 (lease hits under-admit at most)", codes[200])
}
