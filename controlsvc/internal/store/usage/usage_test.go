package usage

import (
	"context"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/controlsvc/internal/store/audit"
)

func flooder(i int) string { return "ip:198.18." + strconv.Itoa(i>>8&255) + "." + strconv.Itoa(i&255) }

// A flood of new identities wakes the flusher at flushAt rather than
// pushing later callers' counts out: an outsider's 30,000 identities a
// second had every other caller's counts dropped until the next flush.
// Counts are dropped only past maxPending, when writes cannot keep up.
func TestRecorderFloodWakesTheFlusher(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	clock := func() time.Time { return now }
	st := InMemory(clock)
	r := NewRecorder(st, audit.NewMemory(clock), slog.New(slog.DiscardHandler))
	for i := range flushAt - 1 {
		r.Record(flooder(i), now, 1, nil)
	}
	if len(r.full) != 0 {
		t.Fatal("the flusher was woken below flushAt")
	}
	r.Record(flooder(flushAt), now, 1, nil)
	if len(r.full) != 1 {
		t.Fatal("the flusher was not woken at flushAt")
	}
	// Until it writes, later callers still count, up to maxPending.
	for i := flushAt + 1; len(r.pending) < maxPending-1; i++ {
		r.Record(flooder(i), now, 1, nil)
	}
	r.Record("user:honest", now, 1, nil)
	r.Record("user:late", now, 1, nil) // past maxPending: dropped
	if r.dropped != 1 {
		t.Fatalf("%d dropped, want 1 (the one past maxPending)", r.dropped)
	}
	if err := r.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]int64{"user:honest": 1, "user:late": 0} {
		rep, err := NewReader(st).Read(context.Background(), id, now.Add(-time.Minute), now)
		if err != nil {
			t.Fatal(err)
		}
		if rep.DayRequests != want {
			t.Errorf("%s: %d requests, want %d", id, rep.DayRequests, want)
		}
	}
}

// Run writes when woken, not only at its interval.
func TestRecorderRunFlushesWhenWoken(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	clock := func() time.Time { return now }
	st := InMemory(clock)
	r := NewRecorder(st, audit.NewMemory(clock), slog.New(slog.DiscardHandler))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go r.Run(ctx, time.Hour)
	for i := range flushAt {
		r.Record(flooder(i), now, 1, nil)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		rep, err := NewReader(st).Read(context.Background(), flooder(0), now.Add(-time.Minute), now)
		if err != nil {
			t.Fatal(err)
		}
		if rep.DayRequests == 1 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("a full recorder was not written before its hourly interval")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
