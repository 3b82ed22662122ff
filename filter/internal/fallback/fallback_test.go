package fallback

import "testing"

func TestAllow(t *testing.T) {
	l := New(2, 1, 2)
	for i, want := range []bool{true, true, false} {
		if ok, _ := l.Allow("a", 100); ok != want {
			t.Fatalf("request %d: %v", i, ok)
		}
	}
	if ok, wait := l.Allow("a", 900); ok || wait != 100 {
		t.Fatalf("wait %d, want 100", wait)
	}
	if ok, _ := l.Allow("a", 1000); !ok {
		t.Fatal("new window denied")
	}
	l.Allow("b", 1000)
	l.Allow("c", 1000) // over max callers: starts over
	if len(l.counts) > 2 {
		t.Fatalf("%d callers tracked, max 2", len(l.counts))
	}
}
