// Package audit keeps the trail of what happened: every admin change (who,
// what, before and after) and every violation, each kind in a capped Redis
// stream of its own, so that what clients cause can never push out what
// operators did.
package audit

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-rl/tollgate/controlsvc/internal/keys"
)

// Event types.
const (
	TypeAdmin     = "admin"
	TypeViolation = "violation"
)

// MaxLen caps each stream (approximately: Redis trims whole nodes).
const MaxLen = 100_000

// stream is where events of a type are kept.
func stream(typ string) string {
	if typ == TypeViolation {
		return keys.AuditViolations
	}
	return keys.Audit
}

// Event is one entry of the trail.
type Event struct {
	ID     string    `json:"id"` // the stream id, set when read
	At     time.Time `json:"at"`
	Type   string    `json:"type"`
	Actor  string    `json:"actor,omitempty"`  // the admin token's name
	Action string    `json:"action,omitempty"` // rule.create, api_key.revoke...
	Target string    `json:"target,omitempty"` // what changed (a rule id, a key id...)
	// Before and After are the changed thing as the API shows it (JSON).
	Before json.RawMessage `json:"before,omitempty"`
	After  json.RawMessage `json:"after,omitempty"`
	// Of a violation.
	Identity string `json:"identity,omitempty"`
	Endpoint string `json:"endpoint,omitempty"`
	RuleID   string `json:"rule_id,omitempty"`
	// Cost is what a violation of a rule that counts tokens (a cost_from)
	// asked for: the request's cost, or the estimate a response cost's
	// admission needed (1 without one). 0 for rules that count requests.
	Cost int64 `json:"cost,omitempty"`
}

// Store appends to and reads the streams.
type Store struct{ streams backend }

// backend keeps the streams: Redis, or this process's memory.
type backend interface {
	add(ctx context.Context, evs []Event) error
	// read returns up to limit events of a stream after the id since ("":
	// from the oldest kept), oldest first.
	read(ctx context.Context, stream, since string, limit int) ([]Event, error)
}

// New returns a store in Redis.
func New(rdb redis.UniversalClient) *Store { return &Store{redisStreams{rdb}} }

// NewMemory returns a store in this process's memory (redis_enabled =
// false), each stream capped at MaxLen as Redis caps it.
func NewMemory(now func() time.Time) *Store {
	return &Store{&memoryStreams{now: now, streams: map[string][]Event{}}}
}

// Append adds events (one round trip).
func (s *Store) Append(ctx context.Context, evs ...Event) error {
	if len(evs) == 0 {
		return nil
	}
	return s.streams.add(ctx, evs)
}

type redisStreams struct{ rdb redis.UniversalClient }

func (s redisStreams) add(ctx context.Context, evs []Event) error {
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i := range evs {
			p.XAdd(ctx, &redis.XAddArgs{Stream: stream(evs[i].Type), MaxLen: MaxLen, Approx: true, Values: fields(&evs[i])})
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("append to the audit trail: %w", err)
	}
	return nil
}

func fields(e *Event) []any {
	out := []any{"at", e.At.UTC().Format(time.RFC3339Nano), "type", e.Type}
	for _, kv := range [][2]string{{"actor", e.Actor}, {"action", e.Action}, {"target", e.Target},
		{"before", string(e.Before)}, {"after", string(e.After)}, {"identity", e.Identity}, {"endpoint", e.Endpoint}, {"rule_id", e.RuleID}} {
		if kv[1] != "" {
			out = append(out, kv[0], kv[1])
		}
	}
	if e.Cost > 0 {
		out = append(out, "cost", strconv.FormatInt(e.Cost, 10))
	}
	return out
}

// Query selects events: Type ("" for all), those after Since (a stream id,
// "" for the oldest kept), at most Limit.
type Query struct {
	Type  string
	Since string
	Limit int
}

// List returns events oldest first, and the id to pass as Since for the next
// page ("" when there are no more). Without a type, both streams are read
// and merged by id.
func (s *Store) List(ctx context.Context, q Query) ([]Event, string, error) {
	if q.Type != "" {
		return s.list(ctx, stream(q.Type), q)
	}
	admin, moreAdmin, err := s.list(ctx, keys.Audit, q)
	if err != nil {
		return nil, "", err
	}
	violations, moreViolations, err := s.list(ctx, keys.AuditViolations, q)
	if err != nil {
		return nil, "", err
	}
	out := append(admin, violations...)
	slices.SortStableFunc(out, func(a, b Event) int { return compareIDs(a.ID, b.ID) })
	if len(out) > q.Limit {
		// Cut after the limit, but never between two events of one id (one
		// in each stream): the next page starts after that id.
		n := q.Limit
		for n < len(out) && out[n].ID == out[n-1].ID {
			n++
		}
		if n < len(out) {
			return out[:n], out[n-1].ID, nil
		}
	}
	next := ""
	if moreAdmin != "" || moreViolations != "" {
		next = out[len(out)-1].ID
	}
	return out, next, nil
}

// list reads one page of one stream; the cursor is "" when the page was
// not full.
func (s *Store) list(ctx context.Context, key string, q Query) ([]Event, string, error) {
	out, err := s.streams.read(ctx, key, q.Since, q.Limit)
	if err != nil {
		return nil, "", err
	}
	if len(out) < q.Limit {
		return out, "", nil
	}
	return out, out[len(out)-1].ID, nil
}

func (s redisStreams) read(ctx context.Context, stream, since string, limit int) ([]Event, error) {
	start := "-"
	if since != "" {
		start = "(" + since
	}
	msgs, err := s.rdb.XRangeN(ctx, stream, start, "+", int64(limit)).Result()
	if err != nil {
		return nil, fmt.Errorf("read the audit trail: %w", err)
	}
	out := make([]Event, len(msgs))
	for i, m := range msgs {
		out[i] = decode(m)
	}
	return out, nil
}

// memoryStreams numbers events as Redis does ("<ms>-<seq>", increasing
// across both streams).
type memoryStreams struct {
	now     func() time.Time
	mu      sync.Mutex
	lastMs  int64
	seq     int64
	streams map[string][]Event
}

func (s *memoryStreams) add(_ context.Context, evs []Event) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range evs {
		ms := s.now().UnixMilli()
		if ms > s.lastMs {
			s.lastMs, s.seq = ms, 0
		} else {
			s.seq++
		}
		e.ID = strconv.FormatInt(s.lastMs, 10) + "-" + strconv.FormatInt(s.seq, 10)
		// Stored as Redis returns it: the time at its precision, in UTC.
		e.At, _ = time.Parse(time.RFC3339Nano, e.At.UTC().Format(time.RFC3339Nano))
		st := append(s.streams[stream(e.Type)], e)
		if len(st) > MaxLen {
			st = slices.Delete(st, 0, len(st)-MaxLen)
		}
		s.streams[stream(e.Type)] = st
	}
	return nil
}

func (s *memoryStreams) read(_ context.Context, stream, since string, limit int) ([]Event, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.streams[stream]
	i := 0
	if since != "" {
		i, _ = slices.BinarySearchFunc(st, since, func(e Event, id string) int {
			// The first event after since.
			if compareIDs(e.ID, id) <= 0 {
				return -1
			}
			return 1
		})
	}
	return slices.Clone(st[i:min(i+limit, len(st))]), nil
}

// compareIDs orders stream ids ("<ms>-<seq>") as Redis does.
func compareIDs(a, b string) int {
	ams, aseq, _ := strings.Cut(a, "-")
	bms, bseq, _ := strings.Cut(b, "-")
	x, _ := strconv.ParseUint(ams, 10, 64)
	y, _ := strconv.ParseUint(bms, 10, 64)
	if c := cmp.Compare(x, y); c != 0 {
		return c
	}
	x, _ = strconv.ParseUint(aseq, 10, 64)
	y, _ = strconv.ParseUint(bseq, 10, 64)
	return cmp.Compare(x, y)
}

func decode(m redis.XMessage) Event {
	str := func(k string) string { v, _ := m.Values[k].(string); return v }
	e := Event{ID: m.ID, Type: str("type"), Actor: str("actor"), Action: str("action"), Target: str("target"),
		Identity: str("identity"), Endpoint: str("endpoint"), RuleID: str("rule_id")}
	e.At, _ = time.Parse(time.RFC3339Nano, str("at"))
	e.Cost, _ = strconv.ParseInt(str("cost"), 10, 64)
	if b := str("before"); b != "" {
		e.Before = json.RawMessage(b)
	}
	if a := str("after"); a != "" {
		e.After = json.RawMessage(a)
	}
	return e
}

// ValidID reports whether s is a stream id ("1700000000000-0").
func ValidID(s string) bool {
	ms, seq, ok := strings.Cut(s, "-")
	if !ok {
		return false
	}
	_, err1 := strconv.ParseUint(ms, 10, 64)
	_, err2 := strconv.ParseUint(seq, 10, 64)
	return err1 == nil && err2 == nil
}

type actorKey struct{}

// WithActor names who acts in ctx (the admin token's name).
func WithActor(ctx context.Context, name string) context.Context {
	return context.WithValue(ctx, actorKey{}, name)
}

// ActorOf returns who acts in ctx ("" when unknown).
func ActorOf(ctx context.Context) string {
	name, _ := ctx.Value(actorKey{}).(string)
	return name
}

// Change is the event of an admin change: before and after are marshalled
// as they are (nil for none).
func Change(ctx context.Context, at time.Time, action, target string, before, after any) Event {
	return Event{At: at, Type: TypeAdmin, Actor: ActorOf(ctx), Action: action, Target: target, Before: raw(before), After: raw(after)}
}

func raw(v any) json.RawMessage {
	if v == nil {
		return nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil
	}
	return b
}
