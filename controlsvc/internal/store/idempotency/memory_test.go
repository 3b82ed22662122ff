package idempotency

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/shared/wire"
)

// In memory, a key is claimed once, replayed until its TTL, reusable after
// it, and the keys held are bounded.
func TestMemoryStore(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	s := NewMemory(func() time.Time { return now })
	ctx := context.Background()
	if a, err := s.Claim(ctx, "k", "d1"); a != nil || err != nil {
		t.Fatalf("first claim: %v %v", a, err)
	}
	if _, err := s.Claim(ctx, "k", "d1"); !errors.Is(err, ErrInFlight) {
		t.Fatalf("claim while in flight: %v", err)
	}
	if err := s.Save(ctx, "k", "d1", &wire.BatchCheckResponse{}); err != nil {
		t.Fatal(err)
	}
	if a, err := s.Claim(ctx, "k", "d1"); err != nil || a == nil || !a.Replayed {
		t.Fatalf("replay: %v %v", a, err)
	}
	if _, err := s.Claim(ctx, "k", "d2"); !errors.Is(err, ErrReused) {
		t.Fatalf("other checks: %v", err)
	}
	now = now.Add(TTL)
	if a, err := s.Claim(ctx, "k", "d2"); a != nil || err != nil {
		t.Fatalf("after the TTL: %v %v", a, err)
	}
	for i := 1; i < MaxMemoryKeys; i++ {
		if _, err := s.Claim(ctx, strconv.Itoa(i), "d"); err != nil {
			t.Fatalf("claim %d: %v", i, err)
		}
	}
	if _, err := s.Claim(ctx, "one more", "d"); err == nil {
		t.Fatal("a claim past the bound was taken")
	}
	now = now.Add(claimTTL)
	if _, err := s.Claim(ctx, "one more", "d"); err != nil {
		t.Fatalf("once the claims expired: %v", err)
	}
}
