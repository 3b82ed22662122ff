// Command tollgate-bench measures the control service against the Redis it
// runs on, for `make bench`: checks per second and latency through the HTTP
// API under a bounded loopback load, redis-benchmark's EVALSHA rate for the
// same token-bucket script on the same Redis, and Redis memory per live
// token-bucket key. Every loop is bounded in count and in time.
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/csv"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-rl/tollgate/controlsvc/internal/app"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/config"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/keys"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/limiter"
	"github.com/tollgate-rl/tollgate/shared/rules"
	"github.com/tollgate-rl/tollgate/testkit/loadtest"
)

// cpuProfile is the -cpuprofile flag.
var cpuProfile *string

func main() {
	if err := run(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "tollgate-bench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	redisAddr := flag.String("redis", "127.0.0.1:6379", "Redis address (loopback)")
	requests := flag.Int("requests", 20000, "HTTP checks to send")
	concurrency := flag.Int("c", 32, "concurrent HTTP clients")
	maxTime := flag.Duration("max-time", 30*time.Second, "stop the HTTP load after this long")
	keyCount := flag.Int("keys", 10000, "token-bucket keys for the memory measurement")
	rounds := flag.Int("rounds", 5, "rounds of the raw-client load and redis-benchmark's EVALSHA, one after the other")
	app.TuneGC(os.LookupEnv) // the service's collector, as its binary sets it
	cpuProfile = flag.String("cpuprofile", "", "write a CPU profile of the HTTP load (service and load generator, one process) to this file")
	flag.Parse()
	if !strings.HasPrefix(*redisAddr, "127.") && !strings.HasPrefix(*redisAddr, "[::1]") && !strings.HasPrefix(*redisAddr, "localhost:") {
		return fmt.Errorf("-redis %s: benchmarks only run against loopback", *redisAddr)
	}
	fmt.Printf("Tollgate control service benchmark (Redis %s, loopback)\n\n", *redisAddr)
	rdb := redis.NewClient(&redis.Options{Addr: *redisAddr})
	defer rdb.Close()
	lim, err := limiter.New(rdb)
	if err != nil {
		return err
	}
	defer lim.Close()
	if err := lim.Load(ctx); err != nil {
		return err
	}
	sha, _ := lim.ScriptHash(rules.TokenBucket)
	evalsha := func() (float64, error) { return redisBenchmark(*redisAddr, sha, *concurrency) }
	if err := benchService(ctx, *redisAddr, loadtest.Config{Requests: int64(*requests), Concurrency: *concurrency, MaxTime: *maxTime}, *rounds, evalsha); err != nil {
		return err
	}

	perKey, err := memoryPerKey(ctx, rdb, lim, *keyCount)
	if err != nil {
		return err
	}
	fmt.Printf("\nRedis memory per live token-bucket key (MEMORY USAGE, mean of %d keys): %.0f bytes (design estimate: ~150)\n", *keyCount, perKey)
	return nil
}

// benchService runs a control service on loopback against Redis at
// redisAddr and drives its check route with load (Request is filled in
// here): once by Go's net/http client (what a Go caller pays, the client's
// CPU sharing the machine with the service and Redis), then in each round by
// loadtest's raw client (a write and a read a check, as redis-benchmark
// drives Redis: the service's own ceiling) and at once by evalsha, the raw
// script's rate. It prints each round's ratio and their median: the two
// loads one after the other in every round, so a slow stretch of this
// noisy machine falls on one round, not on one side of the ratio.
func benchService(ctx context.Context, redisAddr string, load loadtest.Config, rounds int, evalsha func() (float64, error)) error {
	// The checks carry a decision token, as the filter's do: the benchmark
	// measures the credentialed path.
	token := "bench-" + rand.Text()
	env := map[string]string{
		"TOLLGATE_DECISION_TOKEN": token,
		"TOLLGATE_LISTEN":         "127.0.0.1:0",
		"TOLLGATE_REDIS_URL":      "redis://" + redisAddr + "/0",
		"TOLLGATE_LOG_LEVEL":      "error",
	}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	// One counter per check, like the peer's per-user descriptor and the
	// raw EVALSHA it is compared with (a per-endpoint tier, the default,
	// also counts the caller's total: two counters a check).
	toml := []byte("default_algorithm = \"token_bucket\"\n[[tiers]]\nname = \"free\"\nlimit = 1000000\nwindow_seconds = 60\nper_endpoint = false\n")
	cfg, err := config.Parse(toml, lookup)
	if err != nil {
		return err
	}
	a, err := app.New(cfg, "", lookup, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		return err
	}
	if err := a.Listen(); err != nil {
		return err
	}
	sctx, stop := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- a.Serve(sctx) }()
	defer func() { stop(); <-served }()

	base := "http://" + a.Addr() + "/v1/rate-limit/check"
	body := func(i int64) string { return fmt.Sprintf(`{"user_id":"bench-%d","endpoint":"/api/v1/items"}`, i%1000) }
	load.Request = func(i int64) (*http.Request, error) {
		req, err := http.NewRequest(http.MethodPost, base, strings.NewReader(body(i)))
		if err == nil {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		return req, err
	}
	// The same checks as bytes, for the raw client: built before the run.
	raw := make([][]byte, 1000)
	for i := range raw {
		b := body(int64(i))
		raw[i] = fmt.Appendf(nil, "POST /v1/rate-limit/check HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\n"+
			"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", a.Addr(), token, len(b), b)
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
	}
	defer pprof.StopCPUProfile()
	res, err := loadtest.Run(ctx, load)
	if err == nil && res.Failures > 0 {
		err = fmt.Errorf("%d checks failed", res.Failures)
	}
	if err != nil {
		return err
	}
	fmt.Printf("controlsvc  POST /v1/rate-limit/check  %d clients (Go's net/http client), %v\n", load.Concurrency, res)
	load.Request, load.Raw, load.Addr = nil, func(i int64) []byte { return raw[i%1000] }, a.Addr()
	var ratios, goRatios []float64
	for round := range max(rounds, 1) {
		rawRes, err := loadtest.Run(ctx, load)
		if err == nil && rawRes.Failures > 0 {
			err = fmt.Errorf("%d checks failed", rawRes.Failures)
		}
		if err != nil {
			return err
		}
		fmt.Printf("round %d: controlsvc  POST /v1/rate-limit/check  %d clients (raw HTTP/1.1 client), %v\n", round+1, load.Concurrency, rawRes)
		rate, err := evalsha()
		if err != nil {
			// Without redis-benchmark there is no ratio, but the
			// service's own figures above still stand.
			fmt.Printf("redis-benchmark: %v\n", err)
			return nil
		}
		ratios, goRatios = append(ratios, rawRes.PerSec/rate), append(goRatios, res.PerSec/rate)
		fmt.Printf("round %d: redis-benchmark  EVALSHA token_bucket    %d clients: %.0f calls/s; ratio %.2f\n", round+1, load.Concurrency, rate, ratios[round])
	}
	lo, mid, hi := loadtest.Spread(ratios)
	_, goMid, _ := loadtest.Spread(goRatios)
	fmt.Printf("ratio  controlsvc / raw EVALSHA: %.2f driven raw, as redis-benchmark drives Redis (median of %d rounds; %.2f-%.2f; %.2f through Go's net/http client)\n",
		mid, len(ratios), lo, hi, goMid)
	return nil
}

// redisBenchmark runs the token-bucket script with redis-benchmark: the
// ceiling any service calling that script over one Redis can reach.
func redisBenchmark(addr, sha string, c int) (float64, error) {
	host, port, ok := strings.Cut(addr, ":")
	if !ok {
		return 0, fmt.Errorf("address %q has no port", addr)
	}
	o := keys.NewOwner("user", "redis-benchmark")
	args := []string{"-h", host, "-p", port, "-n", "100000", "-c", strconv.Itoa(c), "--csv",
		"EVALSHA", sha, "3", keys.Counter(o, "bench", "", "token_bucket", 60), keys.Penalty(o), keys.Block(o),
		"1000000000", "60000", "1000000000", "1", "0", "0", "0.1", "0", "0", "0", "0", "1"}
	cmd := exec.Command("redis-benchmark", args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("start redis-benchmark (install redis-tools): %w", err)
	}
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			return 0, fmt.Errorf("redis-benchmark: %v: %s", err, out.String())
		}
	case <-time.After(2 * time.Minute):
		_ = cmd.Process.Kill()
		return 0, fmt.Errorf("redis-benchmark did not finish in 2 minutes")
	}
	rows, err := csv.NewReader(&out).ReadAll()
	if err != nil {
		return 0, fmt.Errorf("read redis-benchmark csv: %w", err)
	}
	for _, r := range rows {
		if len(r) >= 2 && r[0] != "test" {
			return strconv.ParseFloat(r[1], 64)
		}
	}
	return 0, fmt.Errorf("no rate in redis-benchmark output: %q", out.String())
}

// memoryPerKey creates n live token-bucket counters the way the service does
// and averages MEMORY USAGE over them.
func memoryPerKey(ctx context.Context, rdb *redis.Client, lim *limiter.Limiter, n int) (float64, error) {
	var total int64
	for i := 0; i < n; i++ {
		r := limiter.Request{Owner: keys.NewOwner("identity", fmt.Sprintf("user:mem-%06d", i)), Endpoint: "/api/v1/items", Cost: 1,
			Rule: &rules.Rule{ID: "tier_free", Algorithm: rules.TokenBucket, Limit: 100, WindowSeconds: 60, PerEndpoint: true}}
		if _, err := lim.Do(ctx, r); err != nil {
			return 0, err
		}
		u, err := rdb.MemoryUsage(ctx, r.Key()).Result()
		if err != nil {
			return 0, fmt.Errorf("MEMORY USAGE: %w", err)
		}
		total += u
	}
	return float64(total) / float64(n), nil
}
