package limiter

import (
	"context"
	"testing"
)

// Count is envoyproxy/ratelimit's fixed window: every hit counts, refused
// or not, a read adds nothing, and each key counts apart.
func TestCount(t *testing.T) {
	l, rdb := newLimiter(t)
	ctx := context.Background()
	steps := []struct {
		key        string
		hits, want int64
	}{
		{"a", 3, 3},
		{"a", 5, 8},
		{"a", 0, 8},
		{"b", 1, 1},
		{"a", 1 << 40, 8 + 1<<40},
	}
	for i, s := range steps {
		got, err := l.Count(ctx, s.key, s.hits, 3600)
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if got.Count != s.want || got.ResetSeconds < 1 || got.ResetSeconds > 3600 {
			t.Fatalf("step %d: %+v, want count %d and a reset within the hour", i, got, s.want)
		}
	}
	if ttl := rdb.TTL(ctx, "a").Val(); ttl <= 0 || ttl.Seconds() > 3600 {
		t.Fatalf("the counter's TTL is %v: it must end with its window", ttl)
	}
	if n := rdb.Exists(ctx, "c").Val(); n != 0 {
		t.Fatal("a read created nothing, yet c exists")
	}
	if _, err := l.Count(ctx, "c", 0, 60); err != nil {
		t.Fatal(err)
	}
	if n := rdb.Exists(ctx, "c").Val(); n != 0 {
		t.Fatal("a read of c stored a counter")
	}
	for _, bad := range [][2]int64{{-1, 60}, {1, 0}, {1, -5}} {
		if _, err := l.Count(ctx, "a", bad[0], bad[1]); err == nil {
			t.Errorf("Count(hits %d, window %d) was accepted", bad[0], bad[1])
		}
	}
}
