// Command gateway-bench measures what the filter costs a request: requests
// per second and p50/p99 through the gateway with the filter, against the same
// gateway without it, in one run, to one loopback upstream. The filter calls
// a running control service (-control); `make bench` starts one. Bounded in
// count and time.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
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

func run() error {
	wasmPath := flag.String("wasm", "build/tollgate.wasm", "the filter module")
	control := flag.String("control", "http://127.0.0.1:8081", "control service URL (loopback)")
	requests := flag.Int64("requests", 20000, "requests per gateway")
	concurrency := flag.Int("c", 32, "concurrent clients")
	maxTime := flag.Duration("max-time", 30*time.Second, "stop each load after this long")
	lease := flag.Int64("lease", 50, "tokens per lease (0: every request calls out)")
	token := flag.String("decision-token", os.Getenv("TOLLGATE_DECISION_TOKEN"), "the control service's decision token")
	flag.Parse()
	ctx := context.Background()
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
	config := fmt.Sprintf(`{"control_cluster":"controlsvc","decision_token":%q,"timeout_ms":1000,"lease":{"request":%d}}`, *token, *lease)
	fmt.Printf("Gateway benchmark: %d requests, %d clients, lease %d, loopback upstream\n", *requests, *concurrency, *lease)
	var rates [2]float64
	for i, noFilter := range []bool{false, true} {
		g, err := gateway.New(ctx, gateway.Config{Wasm: wasm, PluginConfig: []byte(config), Upstream: up,
			Clusters: map[string]*url.URL{"controlsvc": ctl}, VMs: 2, NoFilter: noFilter, XFFTrustedHops: 1})
		if err != nil {
			return err
		}
		gw, stop, err := serve(g)
		if err != nil {
			return err
		}
		res, err := loadtest.Run(ctx, loadtest.Config{
			Requests: *requests, Concurrency: *concurrency, MaxTime: *maxTime,
			Request: func(i int64) (*http.Request, error) {
				r, err := http.NewRequest(http.MethodGet, gw.String()+"/api/v1/items", nil)
				if err == nil {
					// A few hundred callers behind one trusted proxy (the
					// load generator), so leases and counters both work.
					r.Header.Set("X-Forwarded-For", fmt.Sprintf("198.51.%d.%d", i%3, i%250+1))
				}
				return r, err
			},
		})
		stop()
		g.Close(ctx)
		if err != nil {
			return err
		}
		label := "with the filter   "
		if noFilter {
			label = "without the filter"
		}
		fmt.Printf("%s  %v\n", label, res)
		rates[i] = res.PerSec
	}
	fmt.Printf("ratio with/without: %.2f\n", rates[0]/rates[1])
	return nil
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
