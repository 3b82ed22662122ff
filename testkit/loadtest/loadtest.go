// Package loadtest drives a bounded HTTP load against a loopback server and
// reports throughput and latency percentiles. Every run stops by itself: at
// Requests sent or at MaxTime, whichever comes first. The control service's
// and the gateway's benchmarks both use it.
package loadtest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Config of one run.
type Config struct {
	// Request builds the i-th request (0-based).
	Request func(i int64) (*http.Request, error)
	// Raw, when set, is used instead of Request: the i-th request as the
	// bytes of one HTTP/1.1 message, written to Addr (host:port, loopback)
	// on a kept-alive connection of each client's own, and its answer read
	// by a parser that knows only Content-Length bodies (raw.go). Its cost
	// per request is a write and a read, as redis-benchmark's is against
	// Redis: a server's throughput measured with it is not bounded by the
	// load generator's HTTP client sharing the machine.
	Raw         func(i int64) []byte
	Addr        string
	Requests    int64
	Concurrency int
	MaxTime     time.Duration
	// OK decides whether a status counts as a success (default: 2xx).
	OK func(status int) bool
}

// Result of a run.
type Result struct {
	Requests int64
	Elapsed  time.Duration
	PerSec   float64
	P50, P99 time.Duration
	Failures int64
}

func (r Result) String() string {
	return fmt.Sprintf("%d requests: %.0f req/s  p50 %v  p99 %v  failures %d",
		r.Requests, r.PerSec, r.P50.Round(time.Microsecond), r.P99.Round(time.Microsecond), r.Failures)
}

// ErrNotLoopback refuses targets outside 127.0.0.0/8 and ::1.
var ErrNotLoopback = errors.New("loadtest: only loopback targets")

// Run sends the load.
func Run(ctx context.Context, c Config) (Result, error) {
	if c.Concurrency < 1 || c.Requests < 1 || c.MaxTime <= 0 || (c.Request == nil) == (c.Raw == nil) {
		return Result{}, errors.New("loadtest: one of Request and Raw, and Requests, Concurrency and MaxTime are required")
	}
	if c.OK == nil {
		c.OK = func(s int) bool { return s >= 200 && s < 300 }
	}
	if c.Raw != nil {
		return runRaw(ctx, c)
	}
	tr := &http.Transport{MaxIdleConnsPerHost: c.Concurrency, MaxConnsPerHost: c.Concurrency}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	return drive(ctx, c, func() (roundTrip, func()) {
		return func(ctx context.Context, i int64) (int, time.Duration, error) {
			req, err := c.Request(i)
			if err != nil {
				return 0, 0, fatal{err}
			}
			if !loopback(req.URL.Hostname()) {
				return 0, 0, fatal{ErrNotLoopback}
			}
			t0 := time.Now()
			resp, err := hc.Do(req.WithContext(ctx))
			if err != nil {
				return 0, 0, err
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			return resp.StatusCode, time.Since(t0), nil
		}, func() {}
	})
}

// roundTrip performs request i for one client: its status and how long it
// took, or an error (a failure, counted; a fatal one stops the run).
type roundTrip func(ctx context.Context, i int64) (status int, took time.Duration, err error)

// fatal is a roundTrip error that stops the run with its cause.
type fatal struct{ error }

// drive runs c.Concurrency clients, each made by newClient (with what ends
// it), taking request indices in turn until c.Requests or c.MaxTime.
func drive(ctx context.Context, c Config, newClient func() (roundTrip, func())) (Result, error) {
	ctx, cancel := context.WithTimeout(ctx, c.MaxTime)
	defer cancel()
	var next, failures atomic.Int64
	lat := make([][]time.Duration, c.Concurrency)
	errc := make(chan error, c.Concurrency)
	var wg sync.WaitGroup
	start := time.Now()
	for w := range c.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			do, end := newClient()
			defer end()
			for ctx.Err() == nil {
				i := next.Add(1) - 1
				if i >= c.Requests {
					return
				}
				status, took, err := do(ctx, i)
				var stop fatal
				switch {
				case errors.As(err, &stop):
					errc <- stop.error
					return
				case err != nil:
					if ctx.Err() != nil {
						return
					}
					failures.Add(1)
					continue
				case !c.OK(status):
					failures.Add(1)
				}
				lat[w] = append(lat[w], took)
			}
		}()
	}
	wg.Wait()
	close(errc)
	if err := <-errc; err != nil {
		return Result{}, err
	}
	return result(start, lat, failures.Load())
}

// result sums up a run that started at start: each client's latencies, and
// the failures.
func result(start time.Time, lat [][]time.Duration, failures int64) (Result, error) {
	elapsed := time.Since(start)
	all := slices.Concat(lat...)
	if len(all) == 0 {
		return Result{}, errors.New("loadtest: no request completed")
	}
	slices.Sort(all)
	pct := func(p float64) time.Duration { return all[min(len(all)-1, int(p*float64(len(all))))] }
	return Result{Requests: int64(len(all)), Elapsed: elapsed, PerSec: float64(len(all)) / elapsed.Seconds(),
		P50: pct(0.50), P99: pct(0.99), Failures: failures}, nil
}

// loopback reports whether host is localhost or a loopback address.
func loopback(host string) bool {
	ip := net.ParseIP(host)
	return host == "localhost" || ip != nil && ip.IsLoopback()
}

// Spread is the least, the median and the most of rounds' figures (zeros
// for none): benchmarks report a ratio as its median over rounds with this
// spread beside it.
func Spread(v []float64) (lo, mid, hi float64) {
	if len(v) == 0 {
		return 0, 0, 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[0], s[len(s)/2], s[len(s)-1]
}
