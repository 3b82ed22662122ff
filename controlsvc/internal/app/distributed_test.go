package app_test

import (
	"sync"
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/testkit/redistest"
	"github.com/tollgate-rl/tollgate/testkit/windowtest"
)

// Two instances of the service on one Redis are one limiter: 200 concurrent
// checks spread over both admit exactly 100.
func TestTwoInstancesOneLimit(t *testing.T) {
	r := redistest.Start(t)
	url := "redis://" + r.Addr + "/0"
	a := startServiceOn(t, r, url, "", nil)
	b := startServiceOn(t, r, url, "", nil)
	req := map[string]any{"user_id": "shared-caller", "endpoint": "/x", "limit": 100, "window_seconds": 3600, "strategy": "gcra"}
	var mu sync.Mutex
	codes := map[int]int{}
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := 0; i < 200; i++ {
		s := a
		if i%2 == 1 {
			s = b
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			st := s.checkStatus(req)
			mu.Lock()
			codes[st]++
			mu.Unlock()
		}()
	}
	close(start)
	wg.Wait()
	if codes[200] != 100 || codes[429] != 100 {
		t.Fatalf("statuses %v across two instances; want exactly 100 and 100", codes)
	}
}

// An override set through one instance reaches the other with its next
// refresh of the overrides.
func TestOverrideReachesOtherInstance(t *testing.T) {
	windowtest.RoomInMinute(t)
	r := redistest.Start(t)
	url := "redis://" + r.Addr + "/0"
	a := startServiceOn(t, r, url, "override_refresh_ms = 100\n", nil)
	b := startServiceOn(t, r, url, "override_refresh_ms = 100\n", nil)
	check := map[string]any{"user_id": "vip", "endpoint": "/api/v1/export"}
	if got := num(t, b.check(check).json(t), "limit"); got != 100 {
		t.Fatalf("before: limit %d", got)
	}
	put := map[string]any{"user_id": "vip", "endpoint": "/api/v1/export", "limit": 7, "window_seconds": 60, "strategy": "fixed_window"}
	if r := a.admin("PUT", "/v1/rate-limit/config", put); r.status != 200 {
		t.Fatalf("PUT: %d %s", r.status, r.body)
	}
	// The refresh is a timer with no event to await from outside; ask until
	// it has run, bounded (the refresh is every 100ms).
	var got int64
	for i := 0; i < 100; i++ {
		if got = num(t, b.check(check).json(t), "limit"); got == 7 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got != 7 {
		t.Fatalf("the other instance still answers limit %d", got)
	}
}
