package decision

import (
	"testing"
	"time"
)

func TestBreaker(t *testing.T) {
	b := newBreaker(3, time.Second)
	t0 := time.Unix(1000, 0)
	for i := 0; i < 2; i++ {
		if !b.allow(t0) || b.record(false, t0) {
			t.Fatalf("failure %d opened the breaker early", i+1)
		}
	}
	if !b.allow(t0) || !b.record(false, t0) || !b.open() {
		t.Fatal("third failure must open the breaker")
	}
	if b.allow(t0.Add(500 * time.Millisecond)) {
		t.Fatal("open breaker let a call through during the cooldown")
	}
	probe := t0.Add(1100 * time.Millisecond)
	if !b.allow(probe) {
		t.Fatal("no probe after the cooldown")
	}
	if b.allow(probe) {
		t.Fatal("a second probe ran while the first was in flight")
	}
	b.record(false, probe)
	if b.allow(probe.Add(500 * time.Millisecond)) {
		t.Fatal("a failed probe must reopen for a cooldown")
	}
	again := probe.Add(1100 * time.Millisecond)
	if !b.allow(again) || !b.record(true, again) || b.open() {
		t.Fatal("a successful probe must close the breaker")
	}
}
