package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/tollgate-rl/tollgate/testkit/redistest"
)

// soakCallers is how many distinct callers the soak's load comes from.
const soakCallers = 10_000

// sample is what the soak watches, at one moment.
type sample struct {
	at         time.Duration
	requests   int64
	rss        [2]int64 // the replicas' resident memory, bytes
	goroutines [2]int64
	vmMemory   int64 // the gateway's VMs, bytes, summed
	redisMem   int64 // used_memory
}

// soak runs one stack (fail_open) under a steady load from soakCallers
// callers for d, samples every 15 s, and reports the slopes after the first
// fifth (warm-up). It fails when a replica's memory or goroutines keep
// growing: the last third's mean over the mean just after warm-up by more
// than 20% and 8 MiB, or by more than 50 goroutines.
func soak(controlBin, wasmPath string, d time.Duration) error {
	dir, err := os.MkdirTemp("", "soak")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	st := &stack{dir: dir, controlBin: controlBin, mode: "fail_open"}
	defer st.stop()
	if err := st.start(wasmPath); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var requests, errs atomic.Int64
	wg := st.drive(ctx, func(i int64) (int, string) {
		c := int(i % soakCallers)
		return c, fmt.Sprintf("10.250.%d.%d", c/250, c%250+1)
	}, func(_, _ int, _ []byte, _ time.Duration, err error) {
		requests.Add(1)
		if err != nil {
			errs.Add(1)
		}
	})
	fmt.Printf("Soak: %v, %d callers, %d clients, fail_open, 2 replicas; a sample every 15 s\n\n", d, soakCallers, clients)
	fmt.Printf("%8s %10s %12s %12s %11s %11s %12s %12s\n", "at", "requests", "rss 0 (MiB)", "rss 1 (MiB)", "goroutines", "", "VMs (MiB)", "Redis (MiB)")
	var samples []sample
	start := time.Now()
	tick := time.NewTicker(15 * time.Second)
	defer tick.Stop()
	for done := false; !done; {
		select {
		case <-tick.C:
		case <-ctx.Done():
			done = true
		}
		smp, err := st.sample(time.Since(start), requests.Load())
		if err != nil {
			return err
		}
		samples = append(samples, smp)
		fmt.Printf("%8v %10d %12.1f %12.1f %11d %11d %12.1f %12.1f\n", smp.at.Round(time.Second), smp.requests, mib(smp.rss[0]), mib(smp.rss[1]),
			smp.goroutines[0], smp.goroutines[1], mib(smp.vmMemory), mib(smp.redisMem))
	}
	wg.Wait()
	if errs.Load() > 0 {
		return fmt.Errorf("%d requests failed", errs.Load())
	}
	warm := len(samples) / 5
	if len(samples)-warm < 6 {
		return fmt.Errorf("%d samples: too short a soak to read a trend (run at least 2 minutes)", len(samples))
	}
	tail := samples[warm:]
	fmt.Println()
	fmt.Printf("Slopes after warm-up (%v on), by least squares:\n", tail[0].at.Round(time.Second))
	for _, m := range []struct {
		name string
		get  func(sample) float64
		unit string
	}{
		{"replica 0 RSS", func(s sample) float64 { return mib(s.rss[0]) * 1024 }, "KiB/min"},
		{"replica 1 RSS", func(s sample) float64 { return mib(s.rss[1]) * 1024 }, "KiB/min"},
		{"replica 0 goroutines", func(s sample) float64 { return float64(s.goroutines[0]) }, "/min"},
		{"replica 1 goroutines", func(s sample) float64 { return float64(s.goroutines[1]) }, "/min"},
		{"gateway VM memory", func(s sample) float64 { return mib(s.vmMemory) * 1024 }, "KiB/min"},
		{"Redis used memory", func(s sample) float64 { return mib(s.redisMem) * 1024 }, "KiB/min"},
	} {
		fmt.Printf("  %-22s %+10.1f %s\n", m.name, slope(tail, m.get), m.unit)
	}
	last := samples[len(samples)-1]
	fmt.Printf("\nAgainst the seed's target (< 10 MB for 10,000 clients per instance): each replica's whole process holds %.1f and %.1f MiB\n"+
		"resident after %d requests from %d callers; Redis holds %.1f MiB for all of them (counters, usage, audit).\n",
		mib(last.rss[0]), mib(last.rss[1]), last.requests, soakCallers, mib(last.redisMem))
	third := tail[len(tail)*2/3:]
	for i := 0; i < 2; i++ {
		early, late := mean(tail[:3], func(s sample) float64 { return float64(s.rss[i]) }), mean(third, func(s sample) float64 { return float64(s.rss[i]) })
		if late > early*1.2 && late-early > 8<<20 {
			return fmt.Errorf("replica %d's memory kept growing: %.1f -> %.1f MiB", i, mib(int64(early)), mib(int64(late)))
		}
		eg, lg := mean(tail[:3], func(s sample) float64 { return float64(s.goroutines[i]) }), mean(third, func(s sample) float64 { return float64(s.goroutines[i]) })
		if lg-eg > 50 {
			return fmt.Errorf("replica %d's goroutines kept growing: %.0f -> %.0f", i, eg, lg)
		}
	}
	return nil
}

func (st *stack) sample(at time.Duration, requests int64) (sample, error) {
	s := sample{at: at, requests: requests}
	for i, c := range st.controls {
		rss, err := residentBytes(c.cmd.Process.Pid)
		if err != nil {
			return s, err
		}
		s.rss[i] = rss
		if s.goroutines[i], err = metric(strings.TrimSuffix(c.ready, "/health")+"/metrics", "go_goroutines"); err != nil {
			return s, err
		}
	}
	for _, m := range st.gateway.VMMemory() {
		s.vmMemory += int64(m)
	}
	v, err := redistest.Do(st.redisAddr, "INFO", "memory")
	if err != nil {
		return s, err
	}
	for _, line := range strings.Split(fmt.Sprint(v), "\n") {
		if k, val, ok := strings.Cut(strings.TrimSpace(line), ":"); ok && k == "used_memory" {
			s.redisMem, _ = strconv.ParseInt(val, 10, 64)
		}
	}
	return s, nil
}

// residentBytes is a process's VmRSS.
func residentBytes(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("/proc/%d/status has no VmRSS", pid)
}

// metric reads one unlabelled sample from a Prometheus text page.
func metric(url, name string) (int64, error) {
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Get(url)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return int64(f), err
		}
	}
	return 0, fmt.Errorf("%s: no %s", url, name)
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

func mean(ss []sample, f func(sample) float64) float64 {
	t := 0.0
	for _, s := range ss {
		t += f(s)
	}
	return t / float64(len(ss))
}

// slope is the least-squares slope of f over the samples, per minute.
func slope(ss []sample, f func(sample) float64) float64 {
	var sx, sy, sxx, sxy float64
	n := float64(len(ss))
	for _, s := range ss {
		x, y := s.at.Minutes(), f(s)
		sx, sy, sxx, sxy = sx+x, sy+y, sxx+x*x, sxy+x*y
	}
	return (n*sxy - sx*sy) / (n*sxx - sx*sx)
}
