package summary

import (
	"context"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"
)

// What a minute keeps is bounded whatever clients choose: endpoints and
// identities are cut, further endpoints go under Other, and only the most
// refused callers are named; the counts stay whole.
func TestBounded(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	st := InMemory(func() time.Time { return now })
	r := NewRecorder(st, slog.New(slog.DiscardHandler))
	for i := range 5000 {
		r.Observe(Observation{At: now, Throttled: true, Tier: "free", Endpoint: "/" + strconv.Itoa(i) + strings.Repeat("p", 8000),
			Identity: "user:" + strconv.Itoa(i) + strings.Repeat("u", 200), Latency: time.Millisecond})
	}
	if err := r.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	v, err := NewReader(st).Read(context.Background(), "5m", now)
	if err != nil {
		t.Fatal(err)
	}
	if v.TotalRequests != 5000 || v.ThrottledRequests != 5000 {
		t.Fatalf("counts: %+v", v)
	}
	if len(v.ByEndpoint) != maxEndpoints+1 || v.ByEndpoint[Other] == 0 {
		t.Fatalf("%d endpoints kept, want %d and %s", len(v.ByEndpoint), maxEndpoints, Other)
	}
	var sum int64
	for e, n := range v.ByEndpoint {
		if len(e) > maxName+3 {
			t.Fatalf("an endpoint of %d bytes kept", len(e))
		}
		sum += n
	}
	if sum != 5000 || len(v.TopRefused) != 10 || len(v.TopRefused[0].Identity) > maxName+3 {
		t.Fatalf("throttled by endpoint sum to %d; top refused %d", sum, len(v.TopRefused))
	}
	if v.AvgCheckLatencyMs != 1 || v.P95CheckLatencyMs <= 0.5 || v.P95CheckLatencyMs > 1 {
		t.Fatalf("latency: avg %v p95 %v, want 1 and in (0.5, 1]", v.AvgCheckLatencyMs, v.P95CheckLatencyMs)
	}
	if _, err := NewReader(st).Read(context.Background(), "7d", now); err != ErrWindow {
		t.Fatalf("a bad window: %v", err)
	}
}

// The bounds are a minute's, not a flush's: a client naming new paths
// between flushes names at most maxEndpoints of them in the minute, and
// what it sends past them is counted under Other.
func TestBoundedAcrossFlushes(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	st := InMemory(func() time.Time { return now })
	r := NewRecorder(st, slog.New(slog.DiscardHandler))
	for flush := range 60 {
		for i := range 50 {
			r.Observe(Observation{At: now, Throttled: true, Tier: "t" + strconv.Itoa(flush*50+i), Endpoint: "/" + strconv.Itoa(flush*50+i), Latency: time.Millisecond})
		}
		r.Observe(Observation{At: now, Throttled: true, Tier: "t0", Endpoint: "/0", Latency: time.Millisecond}) // named from the first flush on
		if err := r.Flush(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	v, err := NewReader(st).Read(context.Background(), "5m", now)
	if err != nil {
		t.Fatal(err)
	}
	if v.TotalRequests != 60*51 || len(v.ByEndpoint) != maxEndpoints+1 || v.ByEndpoint["/0"] != 61 {
		t.Fatalf("%d checks, %d endpoints named (want %d and %s), /0 counted %d times (want 61)",
			v.TotalRequests, len(v.ByEndpoint), maxEndpoints, Other, v.ByEndpoint["/0"])
	}
	if len(v.ByTier) > maxTiers+1 {
		t.Fatalf("%d tiers named", len(v.ByTier))
	}
	// The next minute names its own, and the recorder forgets the old.
	later := now.Add(3 * time.Minute)
	r.Observe(Observation{At: later, Tier: "new", Endpoint: "/new", Latency: time.Millisecond})
	if len(r.names) != 1 {
		t.Fatalf("names of %d minutes kept", len(r.names))
	}
}

// A caller refused more than the flood around it is named among the most
// refused, wherever its refusals fall in the minute (an outsider's 12,000
// refused decoys a second had the first hundred named and the abuser not).
func TestMostRefusedSurvivesAFlood(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	st := InMemory(func() time.Time { return now })
	r := NewRecorder(st, slog.New(slog.DiscardHandler))
	for i := range 24_000 {
		r.Observe(Observation{At: now, Throttled: true, Tier: "free", Endpoint: "/x", Identity: "ip:198.18." + strconv.Itoa(i>>8&255) + "." + strconv.Itoa(i&255)})
		if i%600 == 599 {
			r.Observe(Observation{At: now, Throttled: true, Tier: "free", Endpoint: "/x", Identity: "ip:203.0.113.22"})
		}
	}
	if err := r.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	v, err := NewReader(st).Read(context.Background(), "5m", now)
	if err != nil {
		t.Fatal(err)
	}
	if len(v.TopRefused) == 0 || v.TopRefused[0].Identity != "ip:203.0.113.22" || v.TopRefused[0].Refused < 40 {
		t.Fatalf("top refused %+v, want ip:203.0.113.22 with its 40 first", v.TopRefused)
	}
}

// The p95 interpolates inside the bucket it falls in.
func TestQuantile(t *testing.T) {
	b := make([]int64, len(LatencyBounds)+1)
	b[3] = 100 // all in (0.5, 1] ms
	if q := quantileMs(b, 0.95); q < 0.97 || q > 0.98 {
		t.Fatalf("p95 %v, want 0.975", q)
	}
	b[len(b)-1] = 10000 // most above the last bound
	if q := quantileMs(b, 0.95); q != 1000 {
		t.Fatalf("p95 above the bounds: %v", q)
	}
	if q := quantileMs(make([]int64, len(b)), 0.95); q != 0 {
		t.Fatalf("empty: %v", q)
	}
}
