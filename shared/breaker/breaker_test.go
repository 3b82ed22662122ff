package breaker

import (
	"testing"
	"time"
)

func TestBreaker(t *testing.T) {
	b := New(3, int64(time.Second))
	t0 := int64(1000 * time.Second)
	for i := 0; i < 2; i++ {
		if !b.Allow(t0) || b.Record(false, t0) {
			t.Fatalf("failure %d opened the breaker early", i+1)
		}
	}
	if !b.Allow(t0) || !b.Record(false, t0) || !b.Open() {
		t.Fatal("third failure must open the breaker")
	}
	if b.Allow(t0 + int64(500*time.Millisecond)) {
		t.Fatal("open breaker let a call through during the cooldown")
	}
	probe := t0 + int64(1100*time.Millisecond)
	if !b.Allow(probe) {
		t.Fatal("no probe after the cooldown")
	}
	if b.Allow(probe) {
		t.Fatal("a second probe ran while the first was in flight")
	}
	b.Record(false, probe)
	if b.Allow(probe + int64(500*time.Millisecond)) {
		t.Fatal("a failed probe must reopen for a cooldown")
	}
	again := probe + int64(1100*time.Millisecond)
	if !b.Allow(again) || !b.Record(true, again) || b.Open() {
		t.Fatal("a successful probe must close the breaker")
	}
}

// A probe whose call said nothing of the dependency (Retry) lets the next
// call probe at once; a closed breaker is left alone.
func TestRetryProbesAgain(t *testing.T) {
	b := New(1, int64(time.Second))
	t0 := int64(1000 * time.Second)
	b.Retry(t0)
	if !b.Allow(t0) || !b.Record(false, t0) {
		t.Fatal("Retry on a closed breaker changed it")
	}
	probe := t0 + int64(1100*time.Millisecond)
	if ok, isProbe := b.Admit(probe); !ok || !isProbe {
		t.Fatal("no probe after the cooldown")
	}
	b.Retry(probe)
	if !b.Allow(probe + 1) {
		t.Fatal("after a probe that found nothing, the next call may not probe")
	}
	if b.Allow(probe + 2) {
		t.Fatal("two probes at once")
	}
}

// A cooldown too long to add to the time it starts still holds the breaker
// open: its end saturates instead of wrapping into the past.
func TestCooldownSaturates(t *testing.T) {
	b := New(1, 1<<63-1)
	now := time.Now().UnixNano()
	if !b.Allow(now) || !b.Record(false, now) {
		t.Fatal("the first failure must open a breaker of threshold 1")
	}
	if b.Allow(now + int64(24*time.Hour)) {
		t.Fatal("the breaker let a call through during an endless cooldown")
	}
}
