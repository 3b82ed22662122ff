// Package idempotency stores the answers of batch checks under their
// idempotency key, so a retried batch is answered again, not counted again.
package idempotency

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-rl/tollgate/controlsvc/internal/keys"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// TTL is how long an answer is replayed for its key.
const TTL = 5 * time.Minute

// claimTTL bounds how long a claim waits for its answer: a service that died
// mid-batch does not lock the key for the whole TTL.
const claimTTL = 30 * time.Second

// Why a claim is refused.
var (
	// ErrReused: the key was used for other checks.
	ErrReused = errors.New("this idempotency_key was used for other checks; use a new key")
	// ErrInFlight: the first request with the key is still being answered,
	// or the key is changing hands.
	ErrInFlight = errors.New("a request with this idempotency_key is still being answered; retry it shortly")
)

// Store keeps claims and answers.
type Store struct{ kv backend }

// backend holds values that expire: Redis, or this process's memory.
type backend interface {
	// setNX stores v under k for ttl unless k holds a value; it reports
	// whether it stored.
	setNX(ctx context.Context, k string, v []byte, ttl time.Duration) (bool, error)
	// get returns k's value; nil when there is none.
	get(ctx context.Context, k string) ([]byte, error)
	set(ctx context.Context, k string, v []byte, ttl time.Duration) error
}

// New returns a store in Redis.
func New(rdb redis.UniversalClient) *Store { return &Store{redisKV{rdb}} }

// NewMemory returns a store in this process's memory (redis_enabled =
// false), holding at most MaxMemoryKeys keys at once.
func NewMemory(now func() time.Time) *Store {
	return &Store{&memoryKV{now: now, m: map[string]memoryValue{}}}
}

// MaxMemoryKeys and MaxMemoryBytes bound what a memory store holds: past
// either (after expired keys are dropped), a new key's claim or answer fails
// as Redis's would when full. Expired keys are also dropped every
// sweepEvery writes, so answers do not outlive their TTL in memory.
const (
	MaxMemoryKeys  = 100_000
	MaxMemoryBytes = 64 << 20
	sweepEvery     = 1024
)

// stored is what a key holds: the digest of the checks it was first used for
// and, once they are answered, the answer (nil while the first request is
// still being answered).
type stored struct {
	Digest string                   `json:"digest"`
	Answer *wire.BatchCheckResponse `json:"answer,omitempty"`
}

// Digest is the SHA-256 of the decoded checks marshalled again: one canonical
// form of the request, whatever its spacing, key order or unknown fields.
func Digest(checks []wire.CheckRequest) string {
	b, _ := json.Marshal(checks) // plain strings and numbers: cannot fail
	d := sha256.Sum256(b)
	return hex.EncodeToString(d[:])
}

// redisKey stores a key under its hex SHA-256: any key, one bounded name.
func redisKey(idemKey string) string {
	sum := sha256.Sum256([]byte(idemKey))
	return keys.Idempotency(hex.EncodeToString(sum[:]))
}

// Claim takes idemKey for the checks with this digest. It returns (nil, nil)
// when the key is the caller's to answer, the stored answer (marked Replayed)
// when the same checks were answered before, ErrReused or ErrInFlight when the
// key is not the caller's, and any other error when Redis failed.
func (s *Store) Claim(ctx context.Context, idemKey, digest string) (*wire.BatchCheckResponse, error) {
	key := redisKey(idemKey)
	pending, err := json.Marshal(stored{Digest: digest})
	if err != nil {
		return nil, fmt.Errorf("encode idempotency claim: %w", err)
	}
	// Two rounds: a claim may expire between the SET NX and the GET.
	for range 2 {
		ok, err := s.kv.setNX(ctx, key, pending, claimTTL)
		if err == nil && ok {
			return nil, nil
		}
		var b []byte
		if err == nil {
			b, err = s.kv.get(ctx, key)
			if err == nil && b == nil {
				continue
			}
		}
		if err != nil {
			return nil, fmt.Errorf("idempotency key: %w", err)
		}
		var st stored
		switch {
		case json.Unmarshal(b, &st) != nil || st.Digest != digest:
			return nil, ErrReused
		case st.Answer == nil:
			return nil, ErrInFlight
		}
		st.Answer.Replayed = true
		return st.Answer, nil
	}
	return nil, ErrInFlight
}

// Save stores the answer of a claimed key, replacing the claim, for TTL.
func (s *Store) Save(ctx context.Context, idemKey, digest string, answer *wire.BatchCheckResponse) error {
	b, err := json.Marshal(stored{Digest: digest, Answer: answer})
	if err != nil {
		return fmt.Errorf("encode batch answer: %w", err)
	}
	if err := s.kv.set(ctx, redisKey(idemKey), b, TTL); err != nil {
		return fmt.Errorf("store batch answer: %w", err)
	}
	return nil
}

type redisKV struct{ rdb redis.UniversalClient }

func (r redisKV) setNX(ctx context.Context, k string, v []byte, ttl time.Duration) (bool, error) {
	return r.rdb.SetNX(ctx, k, v, ttl).Result()
}

func (r redisKV) get(ctx context.Context, k string) ([]byte, error) {
	b, err := r.rdb.Get(ctx, k).Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	return b, err
}

func (r redisKV) set(ctx context.Context, k string, v []byte, ttl time.Duration) error {
	return r.rdb.Set(ctx, k, v, ttl).Err()
}

type memoryValue struct {
	v       []byte
	expires time.Time
}

type memoryKV struct {
	now    func() time.Time
	mu     sync.Mutex
	m      map[string]memoryValue
	bytes  int // held in values
	writes int
}

// sweep drops expired keys. mu is held.
func (m *memoryKV) sweep(now time.Time) {
	for k, x := range m.m {
		if !now.Before(x.expires) {
			m.bytes -= len(x.v)
			delete(m.m, k)
		}
	}
}

// room makes room for n more bytes under a new or replaced key, reporting
// whether there is. mu is held.
func (m *memoryKV) room(now time.Time, n int, newKey bool) bool {
	m.writes++
	full := func() bool { return m.bytes+n > MaxMemoryBytes || newKey && len(m.m) >= MaxMemoryKeys }
	if m.writes%sweepEvery == 0 || full() {
		m.sweep(now)
	}
	return !full()
}

// errFull is a memory store's answer to a new key past MaxMemoryKeys.
var errFull = errors.New("too many idempotency keys held in memory; retry once older ones expire")

func (m *memoryKV) setNX(_ context.Context, k string, v []byte, ttl time.Duration) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	old, ok := m.m[k]
	if ok && now.Before(old.expires) {
		return false, nil
	}
	if !m.room(now, len(v)-len(old.v), !ok) {
		return false, errFull
	}
	old = m.m[k] // the sweep may have dropped it
	m.bytes += len(v) - len(old.v)
	m.m[k] = memoryValue{v: v, expires: now.Add(ttl)}
	return true, nil
}

func (m *memoryKV) get(_ context.Context, k string) ([]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if x, ok := m.m[k]; ok && m.now().Before(x.expires) {
		return x.v, nil
	}
	return nil, nil
}

func (m *memoryKV) set(_ context.Context, k string, v []byte, ttl time.Duration) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	old, ok := m.m[k]
	if !m.room(now, len(v)-len(old.v), !ok) {
		return errFull
	}
	old = m.m[k] // the sweep may have dropped it
	m.bytes += len(v) - len(old.v)
	m.m[k] = memoryValue{v: v, expires: now.Add(ttl)}
	return nil
}
