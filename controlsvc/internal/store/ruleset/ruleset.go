// Package ruleset stores the rules and tiers operators manage at runtime, in
// Redis so every replica shares them. A change bumps the shared version and
// is announced (package changes). Decisions never read this store: replicas
// compile what it holds into their policy when the version moves.
package ruleset

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-rl/tollgate/controlsvc/internal/keys"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/policy"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/store/changes"
	"github.com/tollgate-rl/tollgate/shared/rules"
)

// Rule is a rule managed at runtime. Its ID is the decimal rule_id.
type Rule struct {
	rules.Rule
	// TierID is the tier the rule applies to (0: every tier).
	TierID    int       `json:"tier_id,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// Tier is a tier managed at runtime.
type Tier struct {
	policy.Tier
	UpdatedAt time.Time `json:"updated_at"`
}

// Snapshot is everything the store holds, at one version.
type Snapshot struct {
	Version int64
	Rules   []Rule // by rule id
	Tiers   []Tier // by tier id
}

// ErrNotFound is returned for a rule that is not in the store.
var ErrNotFound = errors.New("no such runtime rule")

// ErrConflict is returned for a change made against a version that is no
// longer the stored one: another change came first. The caller reloads,
// validates again and retries; validating against a stale snapshot and
// writing anyway is how two tiers got one name.
var ErrConflict = errors.New("the rules changed since they were read")

// Store keeps runtime rules and tiers.
type Store struct{ state backend }

// backend keeps the encoded rules and tiers (by id) and the version that
// every change moves: Redis, or this process's memory.
type backend interface {
	load(ctx context.Context) (version int64, rules, tiers map[string]string, err error)
	version(ctx context.Context) (int64, error)
	nextRuleID(ctx context.Context) (int64, error)
	// change applies e if the version is still version, and moves it on;
	// deleted reports whether a deletion found its entry.
	change(ctx context.Context, version int64, e edit) (deleted bool, err error)
}

// edit is one change: the rule or tier with this id set to value, or
// deleted (value nil).
type edit struct {
	tier  bool
	id    string
	value []byte
}

// New returns a store in Redis.
func New(rdb redis.UniversalClient) *Store { return &Store{redisState{rdb}} }

// NewMemory returns a store in this process's memory (redis_enabled =
// false).
func NewMemory() *Store {
	return &Store{&memoryState{rules: map[string]string{}, tiers: map[string]string{}}}
}

// Load reads the whole store. An entry that does not decode is skipped (and
// reported in the error list's log by the caller): a damaged entry must not
// take every replica's rules down.
func (s *Store) Load(ctx context.Context) (Snapshot, []error, error) {
	var snap Snapshot
	var bad []error
	version, ruleMap, tierMap, err := s.state.load(ctx)
	if err != nil {
		return Snapshot{}, nil, err
	}
	snap.Version = version
	for id, v := range ruleMap {
		var r Rule
		if err := json.Unmarshal([]byte(v), &r); err != nil || r.ID != id {
			bad = append(bad, fmt.Errorf("runtime rule %q does not decode", id))
			continue
		}
		if changed := upgradeRule(&r.Rule); len(changed) > 0 {
			bad = append(bad, fmt.Errorf("runtime rule %q was stored before its bounds: read with %s; save it again to store it so", id, strings.Join(changed, ", ")))
		}
		snap.Rules = append(snap.Rules, r)
	}
	for id, v := range tierMap {
		var t Tier
		if err := json.Unmarshal([]byte(v), &t); err != nil || strconv.Itoa(t.ID) != id {
			bad = append(bad, fmt.Errorf("runtime tier %q does not decode", id))
			continue
		}
		if changed := upgradeTier(&t.Tier); len(changed) > 0 {
			bad = append(bad, fmt.Errorf("runtime tier %q was stored before its bounds: read with %s; save it again to store it so", id, strings.Join(changed, ", ")))
		}
		snap.Tiers = append(snap.Tiers, t)
	}
	slices.SortFunc(snap.Rules, func(a, b Rule) int { return cmpID(a.ID, b.ID) })
	slices.SortFunc(snap.Tiers, func(a, b Tier) int { return a.ID - b.ID })
	return snap, bad, nil
}

func cmpID(a, b string) int {
	x, _ := strconv.ParseInt(a, 10, 64)
	y, _ := strconv.ParseInt(b, 10, 64)
	return int(x - y)
}

// Version is the store's change counter.
func (s *Store) Version(ctx context.Context) (int64, error) { return s.state.version(ctx) }

// NextRuleID issues a rule id.
func (s *Store) NextRuleID(ctx context.Context) (int64, error) { return s.state.nextRuleID(ctx) }

// Every change below is made against the snapshot version it was
// validated with (Snapshot.Version) and fails with ErrConflict when the
// store moved on since.

// PutRule stores a rule (new or replaced).
func (s *Store) PutRule(ctx context.Context, r Rule, version int64) error {
	b, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("encode rule: %w", err)
	}
	_, err = s.state.change(ctx, version, edit{id: r.ID, value: b})
	return err
}

// DeleteRule removes a rule; ErrNotFound when there was none.
func (s *Store) DeleteRule(ctx context.Context, id string, version int64) error {
	deleted, err := s.state.change(ctx, version, edit{id: id})
	if err != nil {
		return err
	}
	if !deleted {
		return ErrNotFound
	}
	return nil
}

// PutTier stores a tier (new or replaced).
func (s *Store) PutTier(ctx context.Context, t Tier, version int64) error {
	b, err := json.Marshal(t)
	if err != nil {
		return fmt.Errorf("encode tier: %w", err)
	}
	_, err = s.state.change(ctx, version, edit{tier: true, id: strconv.Itoa(t.ID), value: b})
	return err
}

type redisState struct{ rdb redis.UniversalClient }

func (s redisState) load(ctx context.Context) (int64, map[string]string, map[string]string, error) {
	var ruleMap, tierMap *redis.MapStringStringCmd
	var version *redis.StringCmd
	if _, err := s.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		version = p.Get(ctx, keys.AdminVersion)
		ruleMap = p.HGetAll(ctx, keys.AdminRules)
		tierMap = p.HGetAll(ctx, keys.AdminTiers)
		return nil
	}); err != nil && !errors.Is(err, redis.Nil) {
		return 0, nil, nil, fmt.Errorf("load rules and tiers: %w", err)
	}
	v, _ := version.Int64()
	return v, ruleMap.Val(), tierMap.Val(), nil
}

func (s redisState) version(ctx context.Context) (int64, error) {
	v, err := s.rdb.Get(ctx, keys.AdminVersion).Int64()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read rules version: %w", err)
	}
	return v, nil
}

func (s redisState) nextRuleID(ctx context.Context) (int64, error) {
	id, err := s.rdb.Incr(ctx, keys.AdminRuleSeq).Result()
	if err != nil {
		return 0, fmt.Errorf("issue rule id: %w", err)
	}
	return id, nil
}

// change writes and bumps the version in one transaction, provided the
// version is still the one the change was validated against (WATCH: the
// keys share a hash tag, so this holds in cluster mode too), then announces
// the new version.
func (s redisState) change(ctx context.Context, version int64, e edit) (bool, error) {
	hash := keys.AdminRules
	if e.tier {
		hash = keys.AdminTiers
	}
	var next, del *redis.IntCmd
	err := s.rdb.Watch(ctx, func(tx *redis.Tx) error {
		cur, err := tx.Get(ctx, keys.AdminVersion).Int64()
		if err != nil && !errors.Is(err, redis.Nil) {
			return err
		}
		if cur != version {
			return ErrConflict
		}
		_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
			if e.value != nil {
				p.HSet(ctx, hash, e.id, e.value)
			} else {
				del = p.HDel(ctx, hash, e.id)
			}
			next = p.Incr(ctx, keys.AdminVersion)
			return nil
		})
		return err
	}, keys.AdminVersion)
	switch {
	case errors.Is(err, ErrConflict), errors.Is(err, redis.TxFailedErr):
		return false, ErrConflict
	case err != nil:
		return false, fmt.Errorf("store change: %w", err)
	}
	changes.Announce(ctx, s.rdb, next.Val())
	return del == nil || del.Val() > 0, nil
}

// memoryState is one process's rules and tiers; a change applies at once.
type memoryState struct {
	mu           sync.Mutex
	ver, ruleSeq int64
	rules, tiers map[string]string
}

func (s *memoryState) load(context.Context) (int64, map[string]string, map[string]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ver, maps.Clone(s.rules), maps.Clone(s.tiers), nil
}

func (s *memoryState) version(context.Context) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ver, nil
}

func (s *memoryState) nextRuleID(context.Context) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ruleSeq++
	return s.ruleSeq, nil
}

func (s *memoryState) change(_ context.Context, version int64, e edit) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if version != s.ver {
		return false, ErrConflict
	}
	m := s.rules
	if e.tier {
		m = s.tiers
	}
	_, found := m[e.id]
	if e.value != nil {
		m[e.id] = string(e.value)
	} else {
		delete(m, e.id)
	}
	s.ver++
	return found || e.value != nil, nil
}
