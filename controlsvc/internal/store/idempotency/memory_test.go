package idempotency

import (
	"context"
	"errors"
	"strconv"
	"strings"
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

// Answers are bounded in bytes too, and expired ones leave memory without
// waiting for the store to fill.
func TestMemoryStoreBytes(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	s := NewMemory(func() time.Time { return now })
	kv := s.kv.(*memoryKV)
	ctx := context.Background()
	big := &wire.BatchCheckResponse{Results: make([]wire.BatchResult, 1)}
	big.Results[0].UserID = strings.Repeat("u", 1<<20) // about 1 MiB once encoded
	n := 0
	for ; n < 100; n++ {
		if _, err := s.Claim(ctx, "k"+strconv.Itoa(n), "d"); err != nil {
			break
		}
		if err := s.Save(ctx, "k"+strconv.Itoa(n), "d", big); err != nil {
			break
		}
	}
	if n >= 100 || kv.bytes > MaxMemoryBytes {
		t.Fatalf("held %d answers of 1 MiB (%d bytes): want the store full before 64 MiB", n, kv.bytes)
	}
	now = now.Add(TTL)
	for i := range sweepEvery {
		s.Claim(ctx, "small"+strconv.Itoa(i), "d")
	}
	if kv.bytes > 1<<20 {
		t.Fatalf("%d bytes still held after every answer expired", kv.bytes)
	}
}
