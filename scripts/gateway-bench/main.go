// Command gateway-bench measures what the filter costs a request: requests
// per second and p50/p99 through the gateway with the filter, against the same
// gateway without it, side by side in each of several rounds, to one loopback
// upstream. The filter calls a running control service (-control); `make
// bench` starts one. It also reports the lease economy: control-service
// calls per 1,000 admitted requests, each round and their spread. Bounded in
// count and time.
//
// What sets that number: every caller's first request calls out, and every
// caller's lease ends after lease.ttl_ms (1 s by default) however much is
// left, so a run of R requests a second from C callers, each lease L tokens,
// costs about 1000 × C × max(1/(R×T), 1/(requests per caller), 1/L) calls
// per 1,000 (T the run's length in seconds, at least the TTL). With 750
// callers at 16k requests a second that is ~47 from the TTL alone: the
// figure moves with the machine's speed. The default workload is 200
// callers: a hot set a busy API sees each second.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"runtime/pprof"
	"syscall"
	"time"

	"github.com/tollgate-rl/tollgate/filter/devhost/gateway"
	"github.com/tollgate-rl/tollgate/testkit/loadtest"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "gateway-bench:", err)
		os.Exit(1)
	}
}

type bench struct {
	wasm              []byte
	up, ctl           *url.URL
	config            string
	requests, callers int64
	concurrency, vms  int
	maxTime           time.Duration
	// base picks this run's caller addresses: a run within the counters'
	// window of another would otherwise find its callers' counters in
	// use (leases from their first request).
	base int
}

func run() error {
	wasmPath := flag.String("wasm", "build/tollgate.wasm", "the filter module")
	control := flag.String("control", "http://127.0.0.1:8081", "control service URL (loopback)")
	requests := flag.Int64("requests", 20000, "requests per gateway and round")
	callers := flag.Int64("callers", 200, "distinct callers (client addresses) the requests cycle through")
	concurrency := flag.Int("c", 32, "concurrent clients")
	rounds := flag.Int("rounds", 3, "rounds, each with and without the filter side by side")
	maxTime := flag.Duration("max-time", 30*time.Second, "stop each load after this long")
	lease := flag.Int64("lease", 50, "tokens per lease (0: every request calls out)")
	vms := flag.Int("vms", 2, "VMs of the gateway with the filter (Envoy runs one per worker thread)")
	token := flag.String("decision-token", os.Getenv("TOLLGATE_DECISION_TOKEN"), "the control service's decision token")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the whole run (gateway, upstream and load generator) to this file")
	flag.Parse()
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	wasm, err := os.ReadFile(*wasmPath)
	if err != nil {
		return err
	}
	ctl, err := url.Parse(*control)
	if err != nil {
		return err
	}
	up, stopUp, err := serve(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	if err != nil {
		return err
	}
	defer stopUp()
	b := bench{wasm: wasm, up: up, ctl: ctl, requests: *requests, callers: max(*callers, 1), concurrency: *concurrency, vms: max(*vms, 1), maxTime: *maxTime, base: rand.IntN(250),
		config: fmt.Sprintf(`{"control_cluster":"controlsvc","decision_token":%q,"timeout_ms":1000,"lease":{"request":%d}}`, *token, *lease)}
	fmt.Printf("Gateway benchmark: %d requests from %d callers, %d clients, lease %d, loopback upstream, %d rounds\n",
		*requests, b.callers, *concurrency, *lease, *rounds)
	var ratios, cpuRatios, calls []float64
	for round := range *rounds {
		with, perK, err := b.load(round, false)
		if err != nil {
			return err
		}
		without, _, err := b.load(round, true)
		if err != nil {
			return err
		}
		ratios = append(ratios, with.perSec/without.perSec)
		// Requests per CPU second with over without: the process is the
		// same in both loads but for the filter.
		cpuRatios = append(cpuRatios, float64(without.cpu)/float64(with.cpu))
		calls = append(calls, perK)
		fmt.Printf("round %d: ratio with/without %.2f (per CPU second %.2f); control-service calls per 1,000 admitted %.1f\n",
			round+1, ratios[round], cpuRatios[round], perK)
	}
	lo, mid, hi := loadtest.Spread(ratios)
	fmt.Printf("ratio with/without: %.2f (median of %d rounds; %.2f-%.2f)\n", mid, len(ratios), lo, hi)
	lo, mid, hi = loadtest.Spread(cpuRatios)
	fmt.Printf("requests per CPU second with/without: %.2f (median; %.2f-%.2f)\n", mid, lo, hi)
	if *lease > 0 {
		lo, mid, hi = loadtest.Spread(calls)
		fmt.Printf("control-service calls per 1,000 admitted: %.1f (median; %.1f-%.1f)\n", mid, lo, hi)
	}
	return nil
}

// loadResult is one load's requests a second and the process's CPU time
// per request.
type loadResult struct {
	perSec float64
	cpu    time.Duration
}

// load runs one gateway's load; it returns its result and, with the
// filter, the calls it made per 1,000 admitted requests. Each round's
// callers are new addresses (and each run's, but one time in 250): no
// lease or counter carries over.
func (b *bench) load(round int, noFilter bool) (out loadResult, callsPerK float64, err error) {
	// Labelled, a -cpuprofile splits the two loads (pprof -tagfocus
	// gateway=with): everything the gateway, its callouts and the load
	// generator run for a load starts on this goroutine.
	gateway := "with"
	if noFilter {
		gateway = "without"
	}
	pprof.Do(context.Background(), pprof.Labels("gateway", gateway), func(ctx context.Context) {
		out, callsPerK, err = b.loadLabelled(ctx, round, noFilter)
	})
	return out, callsPerK, err
}

func (b *bench) loadLabelled(ctx context.Context, round int, noFilter bool) (out loadResult, callsPerK float64, err error) {
	g, err := gateway.New(ctx, gateway.Config{Wasm: b.wasm, PluginConfig: []byte(b.config), Upstream: b.up,
		Clusters: map[string]*url.URL{"controlsvc": b.ctl}, VMs: b.vms, NoFilter: noFilter, XFFTrustedHops: 1})
	if err != nil {
		return loadResult{}, 0, err
	}
	defer g.Close(ctx)
	gw, stop, err := serve(g)
	if err != nil {
		return loadResult{}, 0, err
	}
	cpuBefore := processCPU()
	res, err := loadtest.Run(ctx, loadtest.Config{
		Requests: b.requests, Concurrency: b.concurrency, MaxTime: b.maxTime,
		Request: func(i int64) (*http.Request, error) {
			r, err := http.NewRequest(http.MethodGet, gw.String()+"/api/v1/items", nil)
			if err == nil {
				// The callers behind one trusted proxy (the load generator).
				k := i % b.callers
				r.Header.Set("X-Forwarded-For", fmt.Sprintf("10.%d.%d.%d", (b.base+round)%250, k/250%250, k%250+1))
			}
			return r, err
		},
	})
	cpu := processCPU() - cpuBefore
	stop()
	if err != nil {
		return loadResult{}, 0, err
	}
	label := "with the filter   "
	if noFilter {
		label = "without the filter"
	}
	fmt.Printf("  %s  %v  process CPU %.1f µs per request\n", label, res, float64(cpu.Microseconds())/float64(b.requests))
	if !noFilter {
		// Every request the lease cache did not answer called the service.
		h := g.Host()
		if err := decided(h.Counter, b.requests); err != nil {
			return loadResult{}, 0, err
		}
		allowed, hits, denied := h.Counter("tollgate_allowed_total"), h.Counter("tollgate_lease_hits_total"), h.Counter("tollgate_denied_total")
		if allowed > 0 {
			callsPerK = float64(allowed+denied-hits) * 1000 / float64(allowed)
		}
		if os.Getenv("GWBENCH_DEBUG") != "" {
			fmt.Printf("  allowed %d hits %d denied %d degraded %d failures %d refill waits %d\n", allowed, hits, denied,
				h.Counter("tollgate_degraded_total"), h.Counter("tollgate_callout_failures_total"), h.Counter("tollgate_refill_waits_total"))
		}
	}
	return loadResult{perSec: res.PerSec, cpu: cpu / time.Duration(b.requests)}, callsPerK, nil
}

// decided refuses a load whose requests the control service did not
// decide: answered by the failure mode (a wrong -decision-token, a service
// down), the filter's figure would time its degraded path, and the calls
// per 1,000 read 1,000, with nothing on the screen to say so.
func decided(counter func(name string) int64, requests int64) error {
	degraded, failed := counter("tollgate_degraded_total"), counter("tollgate_callout_failures_total")
	if degraded == 0 && failed == 0 {
		return nil
	}
	return fmt.Errorf("the control service did not decide %d of %d requests (the filter answered them by its failure mode; "+
		"%d callouts failed): is it running at -control, and is -decision-token (TOLLGATE_DECISION_TOKEN) its token?",
		degraded, requests, failed)
}

func serve(h http.Handler) (*url.URL, func(), error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	u, _ := url.Parse("http://" + ln.Addr().String())
	return u, func() { srv.Close() }, nil
}

// processCPU is this process's CPU time so far (user and system): the
// gateway, the upstream and the load generator, the same in both loads
// but for the filter.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
