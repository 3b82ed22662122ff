package audit

import (
	"context"
	"testing"
	"time"
)

// In memory, ids grow as Redis's do (a sequence within one millisecond),
// pages follow them, and each stream keeps its newest MaxLen events.
func TestMemoryStore(t *testing.T) {
	now := time.UnixMilli(1_800_000_000_000)
	s := NewMemory(func() time.Time { return now })
	ctx := context.Background()
	var evs []Event
	for range MaxLen + 5 {
		evs = append(evs, Event{Type: TypeViolation, Identity: "user:a"})
	}
	if err := s.Append(ctx, evs...); err != nil {
		t.Fatal(err)
	}
	now = now.Add(time.Millisecond)
	if err := s.Append(ctx, Event{Type: TypeAdmin, Action: "rule.create"}); err != nil {
		t.Fatal(err)
	}
	first, next, err := s.List(ctx, Query{Type: TypeViolation, Limit: 2})
	if err != nil || len(first) != 2 || first[0].ID != "1800000000000-5" || first[1].ID != "1800000000000-6" || next != first[1].ID {
		t.Fatalf("first page %v, next %q, %v: want the oldest kept, 5 trimmed", first, next, err)
	}
	all, next, err := s.List(ctx, Query{Limit: 3, Since: "1800000000000-100003"})
	if err != nil || len(all) != 2 || all[0].ID != "1800000000000-100004" || all[1].ID != "1800000000001-0" || all[1].Action != "rule.create" || next != "" {
		t.Fatalf("last page of both streams %v, next %q, %v", all, next, err)
	}
}
