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

// Store keeps claims and answers in Redis.
type Store struct {
	rdb redis.UniversalClient
}

// New returns a store.
func New(rdb redis.UniversalClient) *Store { return &Store{rdb: rdb} }

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
		ok, err := s.rdb.SetNX(ctx, key, pending, claimTTL).Result()
		if err == nil && ok {
			return nil, nil
		}
		var b []byte
		if err == nil {
			b, err = s.rdb.Get(ctx, key).Bytes()
			if errors.Is(err, redis.Nil) {
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
	if err := s.rdb.Set(ctx, redisKey(idemKey), b, TTL).Err(); err != nil {
		return fmt.Errorf("store batch answer: %w", err)
	}
	return nil
}
