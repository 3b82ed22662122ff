package app_test

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/tollgate-rl/tollgate/controlsvc/internal/rls"
	"github.com/tollgate-rl/tollgate/testkit/redistest"
)

// With Redis gone, fail_open allows (flagged degraded) and fail_closed answers
// 503; /health says so; the process keeps serving; when Redis is back,
// decisions are normal again.
func TestRedisDown(t *testing.T) {
	for _, mode := range []string{"fail_open", "fail_closed"} {
		t.Run(mode, func(t *testing.T) {
			s := startService(t, "", map[string]string{"TOLLGATE_FAILURE_MODE": mode, "TOLLGATE_REDIS_BREAKER_COOLDOWN_MS": "50"})
			req := map[string]any{"user_id": "calm", "endpoint": "/x"}
			if r := s.check(req); r.status != 200 || r.json(t)["degraded"] != nil {
				t.Fatalf("before: %d %s", r.status, r.body)
			}
			s.redis.Stop()
			for i := 0; i < 5; i++ {
				r := s.check(req)
				switch mode {
				case "fail_open":
					if r.status != 200 || r.json(t)["degraded"] != true || r.json(t)["allowed"] != true {
						t.Fatalf("fail_open while down: %d %s", r.status, r.body)
					}
					if r.header.Get("X-RateLimit-Remaining") != "" {
						t.Fatal("a degraded answer must not claim a remaining quota")
					}
				case "fail_closed":
					if r.status != http.StatusServiceUnavailable || r.errorCode(t) != "SERVICE_UNAVAILABLE" {
						t.Fatalf("fail_closed while down: %d %s", r.status, r.body)
					}
				}
			}
			// A malformed key needs no Redis: still 400. A well-formed one
			// cannot be looked up: the failure mode answers.
			keyed := map[string]any{"user_id": "ip:192.0.2.1", "endpoint": "/x", "api_key": "tg_" + strings.Repeat("k", 43)}
			if r := s.check(map[string]any{"user_id": "ip:192.0.2.1", "endpoint": "/x", "api_key": "bogus"}); r.status != 400 {
				t.Fatalf("malformed key while down: %d %s", r.status, r.body)
			}
			if r := s.check(keyed); (mode == "fail_open") != (r.status == 200) {
				t.Fatalf("keyed check while down (%s): %d %s", mode, r.status, r.body)
			}
			h := s.admin("GET", "/health", nil)
			if h.status != 503 || h.json(t)["components"].(map[string]any)["redis"] != "unhealthy" || h.json(t)["failure_mode"] != mode {
				t.Fatalf("health while down, to an operator: %d %s", h.status, h.body)
			}
			// Anyone else learns that it is down (a load balancer needs
			// that), never the error or the failure mode in force.
			if h := s.do("GET", "/health", nil); h.status != 503 || len(h.json(t)) != 2 || h.json(t)["status"] != "unhealthy" {
				t.Fatalf("health while down, to anyone: %d %s", h.status, h.body)
			}
			// Five failures open the breaker: later checks skip Redis.
			if metricValue(t, s, `tollgate_redis_errors_total{op="check"}`) != 5 || metricValue(t, s, "tollgate_redis_breaker_open") != 1 {
				t.Fatal("redis errors not counted, or the breaker did not open")
			}
			s.redis.Restart()
			// Nothing announces that the breaker's cooldown (50ms) is over;
			// ask until a probe goes through, bounded in count.
			var r *response
			for i := 0; i < 200; i++ {
				if r = s.check(req); r.status == 200 && r.json(t)["degraded"] == nil {
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
			if r.status != 200 || r.json(t)["degraded"] != nil || r.header.Get("X-RateLimit-Limit") != "100" {
				t.Fatalf("after Redis came back: %d %s", r.status, r.body)
			}
			if h := s.do("GET", "/health", nil); h.status != 200 {
				t.Fatalf("health after: %d %s", h.status, h.body)
			}
		})
	}
}

// The service starts and answers by its failure mode even when Redis is not
// there at all at start.
func TestStartsWithoutRedis(t *testing.T) {
	r := redistest.Start(t)
	url := "redis://" + r.Addr + "/0"
	r.Stop()
	s := startServiceOn(t, nil, url, "", nil)
	if resp := s.check(map[string]any{"user_id": "x", "endpoint": "/x"}); resp.status != 200 || resp.json(t)["degraded"] != true {
		t.Fatalf("%d %s", resp.status, resp.body)
	}
}

// The service over Sentinel and over a three-node cluster: exact limits, with
// keys of many owners spread over the slots.
func TestTopologies(t *testing.T) {
	master := redistest.Start(t)
	sentinel := redistest.StartSentinel(t, master, "tollgate")
	nodes := redistest.StartCluster(t, 3)
	for name, url := range map[string]string{
		"sentinel": "redis-sentinel://" + sentinel.Addr + "/0?master=tollgate",
		"cluster":  "redis-cluster://" + nodes[0].Addr + "," + nodes[1].Addr,
	} {
		t.Run(name, func(t *testing.T) {
			s := startServiceOn(t, nil, url, "[penalties]\nenabled = true\n", nil)
			for _, user := range []string{"a", "b", "c", "d", "e", "f"} {
				codes := map[int]int{}
				for i := 0; i < 7; i++ {
					r := s.check(map[string]any{"user_id": user, "endpoint": "/x", "limit": 5, "window_seconds": 60, "strategy": "sliding_window"})
					codes[r.status]++
				}
				if codes[200] != 5 || codes[429] != 2 {
					t.Fatalf("user %s: %v; want 5 allowed, 2 denied", user, codes)
				}
			}
			// Concurrent checks of owners on different slots (nodes, in the
			// cluster) share pipelines: still exact per owner.
			const owners, each, limit = 8, 20, 10
			statuses := make(chan int, owners*each)
			var wg sync.WaitGroup
			for o := range owners {
				for range each {
					wg.Add(1)
					go func() {
						defer wg.Done()
						statuses <- s.check(map[string]any{"user_id": "c" + strconv.Itoa(o), "endpoint": "/y", "limit": limit, "window_seconds": 3600, "strategy": "token_bucket"}).status
					}()
				}
			}
			wg.Wait()
			close(statuses)
			codes := map[int]int{}
			for st := range statuses {
				codes[st]++
			}
			if codes[200] != owners*limit || codes[429] != owners*(each-limit) {
				t.Fatalf("concurrent: %v; want %d allowed, %d denied", codes, owners*limit, owners*(each-limit))
			}
			if r := s.do("GET", "/health", nil); r.status != 200 {
				t.Fatalf("health: %d %s", r.status, r.body)
			}
		})
	}
}

// A Sentinel failover: the master dies, Sentinel promotes the replica, and
// the service answers by its failure mode meanwhile and exactly again after.
func TestSentinelFailover(t *testing.T) {
	master := redistest.Start(t)
	replica := redistest.Start(t, "--replicaof", "127.0.0.1", strconv.Itoa(master.Port))
	sentinel := redistest.StartSentinel(t, master, "tollgate")
	// Replication has no event to await from outside; poll its state, bounded.
	for i := 0; ; i++ {
		info, _ := redistest.Do(replica.Addr, "INFO", "replication")
		if strings.Contains(fmt.Sprint(info), "master_link_status:up") {
			break
		}
		if i > 3000 { // 30 s: a loaded CI machine took more than 5
			t.Fatalf("replica never synced: %v", info)
		}
		time.Sleep(10 * time.Millisecond)
	}
	s := startServiceOn(t, nil, "redis-sentinel://"+sentinel.Addr+"/0?master=tollgate", "", map[string]string{"TOLLGATE_REDIS_BREAKER_COOLDOWN_MS": "50"})
	req := map[string]any{"user_id": "failover", "endpoint": "/x"}
	if r := s.check(req); r.status != 200 || r.json(t)["degraded"] != nil {
		t.Fatalf("before: %d %s", r.status, r.body)
	}
	master.Stop()
	// Sentinel needs down-after (1s) plus an election; ask until decisions
	// come from the promoted replica, bounded in count.
	degraded := 0
	var r *response
	for i := 0; i < 1500; i++ {
		r = s.check(req)
		// Degraded answers are counted in the replica's memory: past the
		// tier's 100 a minute they are refusals, never errors.
		if r.status != 200 && (r.status != 429 || r.json(t)["degraded"] != true) {
			t.Fatalf("fail_open answered %d during the failover: %s", r.status, r.body)
		}
		if r.json(t)["degraded"] == nil {
			break
		}
		degraded++
		time.Sleep(10 * time.Millisecond)
	}
	if r.json(t)["degraded"] != nil || r.header.Get("X-RateLimit-Limit") != "100" {
		t.Fatalf("no normal decision after the failover: %s", r.body)
	}
	if degraded == 0 {
		t.Fatal("the outage was never seen: the test proved nothing")
	}
	role, _ := redistest.Do(replica.Addr, "ROLE")
	if l, _ := role.([]any); len(l) == 0 || l[0] != "master" {
		t.Fatalf("replica role %v; want it promoted", role)
	}
}

// One bad counter or rule never switches limiting off for everyone: a tier
// with the largest burst the admin API accepts decides (its script used to
// fail in Redis, and script errors opened the global breaker), and a
// counter whose state is damaged answers 500 for its caller while every
// other caller is decided as usual.
func TestOneBadCounterStaysAlone(t *testing.T) {
	s := startService(t, "[[tiers]]\nname = \"free\"\nlimit = 3\nwindow_seconds = 60\n[[tiers]]\nname = \"huge\"\nlimit = 1\nwindow_seconds = 3600\nburst = 9007199254740991\n", nil)
	for i := 0; i < 3; i++ {
		if r := s.check(map[string]any{"user_id": "big", "endpoint": "/x", "tier": "huge"}); r.status != 200 || r.json(t)["degraded"] != nil || r.json(t)["rule_id"] == "" {
			t.Fatalf("huge burst, check %d: %d %s; want decided, not degraded", i, r.status, r.body)
		}
	}
	ctx := context.Background()
	for _, k := range s.rdb.Keys(ctx, "rl:{identity:user:big}:*").Val() {
		s.rdb.Set(ctx, k, "x", time.Minute)
	}
	for i := 0; i < 10; i++ {
		if r := s.check(map[string]any{"user_id": "big", "endpoint": "/x", "tier": "huge"}); r.status != 500 || r.errorCode(t) != "INTERNAL_ERROR" {
			t.Fatalf("damaged counter, check %d: %d %s", i, r.status, r.body)
		}
	}
	if s.app.Service().BreakerOpen() {
		t.Fatal("a damaged counter opened the breaker")
	}
	for i, want := range []int{200, 200, 200, 429} {
		if r := s.check(map[string]any{"user_id": "other", "endpoint": "/x"}); r.status != want {
			t.Fatalf("another caller, check %d: %d %s; want %d", i, r.status, r.body, want)
		}
	}
}

// While Redis is away, fail_open is not unlimited: each replica counts in
// its own memory at each caller's limit divided by replicas, says degraded,
// and hands decisions back to Redis when it returns.
func TestRedisDownCountsLocally(t *testing.T) {
	// An hour's window: a window ending between the checks below is unlikely.
	toml := "[[tiers]]\nname = \"free\"\nlimit = 6\nwindow_seconds = 3600\nalgorithm = \"fixed_window\"\nper_endpoint = false\n"
	s := startService(t, toml, map[string]string{"TOLLGATE_REDIS_BREAKER_COOLDOWN_MS": "50", "TOLLGATE_REPLICAS": "2"})
	req := map[string]any{"user_id": "counted", "endpoint": "/x"}
	s.redis.Stop()
	// Six an hour over two replicas: three here.
	for i := 0; i < 3; i++ {
		if r := s.check(req); r.status != 200 || r.json(t)["degraded"] != true {
			t.Fatalf("request %d while Redis is down: %d %s", i, r.status, r.body)
		}
	}
	r := s.check(req)
	if r.status != 429 || r.json(t)["degraded"] != true || r.header.Get("Retry-After") == "" {
		t.Fatalf("the fourth request: %d %s", r.status, r.body)
	}
	if other := s.check(map[string]any{"user_id": "another", "endpoint": "/x"}); other.status != 200 {
		t.Fatalf("another caller: %d %s", other.status, other.body)
	}
	if metricValue(t, s, `tollgate_decisions_total{result="degraded",rule="tier_free",tier="free"}`) != 4 ||
		metricValue(t, s, `tollgate_decisions_total{result="denied",rule="tier_free",tier="free"}`) != 1 {
		t.Fatal("degraded decisions are not counted as such")
	}
	s.redis.Restart()
	// Redis decides again once the breaker's probe goes through (bounded).
	for i := 0; ; i++ {
		r = s.check(req)
		if r.status == 200 && r.json(t)["degraded"] == nil {
			break
		}
		if i == 200 {
			t.Fatalf("Redis never took decisions back: %d %s", r.status, r.body)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if r.header.Get("X-RateLimit-Limit") != "6" {
		t.Fatalf("after Redis came back: %s", r.body)
	}
}

// With Redis down under fail_open an API key cannot be looked up, and one
// that cannot be verified buys nothing (an outsider's: any well-formed key
// was admitted uncounted, and past api_key_required_paths, for as long as
// Redis was down): the request is counted as its caller's without it, and
// refused where a key is required, over HTTP and over the rate limit
// service protocol alike.
func TestRedisDownAPIKeyBuysNothing(t *testing.T) {
	toml := "api_key_required_paths = [\"/secure/**\"]\n[[tiers]]\nname = \"free\"\nlimit = 3\nwindow_seconds = 3600\nalgorithm = \"fixed_window\"\nper_endpoint = false\n"
	s, c, _ := rlsService(t, rlsYAML, toml, map[string]string{"TOLLGATE_REDIS_BREAKER_COOLDOWN_MS": "50", "TOLLGATE_FAILURE_MODE": "fail_open"})
	key := func(i int) string { return fmt.Sprintf("ak_live_%043d", i) } // well-formed, never issued
	s.redis.Stop()
	for i := 0; i < 3; i++ {
		r := s.check(map[string]any{"user_id": "ip:198.51.100.7", "endpoint": "/open", "api_key": key(i)})
		if r.status != 200 || r.json(t)["degraded"] != true {
			t.Fatalf("request %d with an unverifiable key: %d %s", i, r.status, r.body)
		}
	}
	if r := s.check(map[string]any{"user_id": "ip:198.51.100.7", "endpoint": "/open", "api_key": key(9)}); r.status != 429 {
		t.Fatalf("the fourth request, counted as its address's: %d %s", r.status, r.body)
	}
	r := s.check(map[string]any{"user_id": "ip:198.51.100.8", "endpoint": "/secure/x", "api_key": key(1)})
	if r.status != 503 || !strings.Contains(string(r.body), `"failure_mode":"fail_closed"`) {
		t.Fatalf("a required key that cannot be verified: %d %s", r.status, r.body)
	}
	rr, err := c.ShouldRateLimit(withToken(decisionToken), &rlspb.RateLimitRequest{Domain: rls.TollgateDomain,
		Descriptors: []*ratelimitv3.RateLimitDescriptor{desc(rls.KeyRemoteAddress, "198.51.100.9", rls.KeyPath, "/secure/x", rls.KeyAPIKey, key(2))}})
	if err != nil || rr.OverallCode != rlspb.RateLimitResponse_OVER_LIMIT || !hasHeader(rr, "x-tollgate-refused") {
		t.Fatalf("the same over the rate limit service protocol: %v %v", rr, err)
	}
}
