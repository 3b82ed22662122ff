// Package overrides stores per-identity, per-endpoint quotas set through
// PUT /v1/rate-limit/config, kept in memory for the hot path.
package overrides

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-rl/tollgate/controlsvc/internal/keys"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/store/changes"
	"github.com/tollgate-rl/tollgate/shared/rules"
)

// Override is a per-identity, per-endpoint quota set through
// PUT /v1/rate-limit/config. It beats every configured rule for that pair.
type Override struct {
	Limit         int64           `json:"limit"`
	WindowSeconds int64           `json:"window_seconds"`
	Algorithm     rules.Algorithm `json:"strategy"`
	Burst         int64           `json:"burst_capacity,omitempty"`
	UpdatedAt     time.Time       `json:"updated_at"`
}

// Store keeps every override in memory, read from one Redis hash. Writes go
// to Redis and to memory at once, and are announced; other replicas refresh
// on the announcement (package changes). Overrides are few (set by operators), so a full read is cheap, and
// the hot path never waits on Redis for them.
type Store struct {
	rdb redis.UniversalClient
	mu  sync.RWMutex
	m   map[string]Override
	// writes counts this replica's own writes: a refresh that read Redis
	// before one of them is older than memory, and is dropped (a delete
	// came back: the refresh its PUT's announcement started had read the
	// hash before the delete, and replaced memory after it).
	writes uint64
}

// New returns an empty store; call Refresh to load it.
func New(rdb redis.UniversalClient) *Store {
	return &Store{rdb: rdb, m: map[string]Override{}}
}

// NewMemory returns a store kept only in this process's memory
// (redis_enabled = false).
func NewMemory() *Store { return New(nil) }

// Get returns the override of identity and endpoint.
func (o *Store) Get(identity, endpoint string) (Override, bool) {
	o.mu.RLock()
	defer o.mu.RUnlock()
	if len(o.m) == 0 {
		return Override{}, false
	}
	ov, ok := o.m[keys.OverrideField(identity, endpoint)]
	return ov, ok
}

// Set stores an override.
func (o *Store) Set(ctx context.Context, identity, endpoint string, ov Override) error {
	b, err := json.Marshal(ov)
	if err != nil {
		return fmt.Errorf("encode override: %w", err)
	}
	field := keys.OverrideField(identity, endpoint)
	if o.rdb != nil {
		if err := o.rdb.HSet(ctx, keys.Overrides, field, b).Err(); err != nil {
			return fmt.Errorf("store override: %w", err)
		}
	}
	o.mu.Lock()
	o.m[field] = ov
	o.writes++
	o.mu.Unlock()
	if o.rdb == nil {
		return nil
	}
	// Other replicas reload on the announcement; the override is stored,
	// so a failed announcement only delays them to their version check.
	return changes.Bump(ctx, o.rdb)
}

// Delete removes an override.
func (o *Store) Delete(ctx context.Context, identity, endpoint string) error {
	field := keys.OverrideField(identity, endpoint)
	if o.rdb != nil {
		if err := o.rdb.HDel(ctx, keys.Overrides, field).Err(); err != nil {
			return fmt.Errorf("delete override: %w", err)
		}
	}
	o.mu.Lock()
	delete(o.m, field)
	o.writes++
	o.mu.Unlock()
	if o.rdb == nil {
		return nil
	}
	return changes.Bump(ctx, o.rdb)
}

// Entry is an override with whom and what it is for.
type Entry struct {
	Identity string `json:"identity"`
	Endpoint string `json:"endpoint"`
	Override
}

// All returns every override, by identity and endpoint.
func (o *Store) All() []Entry {
	o.mu.RLock()
	out := make([]Entry, 0, len(o.m))
	for field, ov := range o.m {
		id, ep, ok := keys.ParseOverrideField(field)
		if ok {
			out = append(out, Entry{Identity: id, Endpoint: ep, Override: ov})
		}
	}
	o.mu.RUnlock()
	slices.SortFunc(out, func(a, b Entry) int {
		return cmp.Or(cmp.Compare(a.Identity, b.Identity), cmp.Compare(a.Endpoint, b.Endpoint))
	})
	return out
}

// Refresh re-reads every override from Redis (in memory: nothing to read).
func (o *Store) Refresh(ctx context.Context) error {
	if o.rdb == nil {
		return nil
	}
	o.mu.RLock()
	writes := o.writes
	o.mu.RUnlock()
	all, err := o.rdb.HGetAll(ctx, keys.Overrides).Result()
	if err != nil {
		return fmt.Errorf("read overrides: %w", err)
	}
	m := make(map[string]Override, len(all))
	for field, v := range all {
		var ov Override
		if err := json.Unmarshal([]byte(v), &ov); err != nil || ov.Limit <= 0 || ov.WindowSeconds <= 0 || !rules.ValidAlgorithm(ov.Algorithm) {
			continue // a damaged entry must not take the service down; skip it
		}
		m[field] = ov
	}
	o.mu.Lock()
	if o.writes == writes {
		// Otherwise a write of ours came after the read; the refresh its
		// announcement starts reads after it.
		o.m = m
	}
	o.mu.Unlock()
	return nil
}
