// Package apikeys stores API keys hashed: the raw key is shown once, at
// creation, and afterwards only its SHA-256 exists. Keys are 256 random bits,
// so a fast hash is enough; there is nothing to brute-force.
package apikeys

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-rl/tollgate/controlsvc/internal/keys"
)

// Prefix starts every raw key, so that leaked keys are easy to scan for.
const Prefix = "tg_"

var formatRE = regexp.MustCompile(`^tg_[A-Za-z0-9_-]{43}$`)

// Errors of look-ups.
var (
	ErrFormat   = errors.New("api key format is invalid")
	ErrNotFound = errors.New("api key not found")
)

// Status of a key.
const (
	StatusActive  = "active"
	StatusRevoked = "revoked"
)

// Record is what is stored about a key; never the key itself.
type Record struct {
	ID        string    `json:"key_id"`
	UserID    string    `json:"user_id"`
	Tier      string    `json:"tier"`
	Status    string    `json:"status"`
	CreatedAt time.Time `json:"created_at"`
	// ExpiresAt is zero for keys that do not expire.
	ExpiresAt time.Time `json:"expires_at,omitzero"`
	RevokedAt time.Time `json:"revoked_at,omitzero"`
}

// Expired reports whether the key has expired at now.
func (r *Record) Expired(now time.Time) bool {
	return !r.ExpiresAt.IsZero() && !now.Before(r.ExpiresAt)
}

// Store keeps key records in Redis.
type Store struct {
	rdb redis.UniversalClient
	now func() time.Time
}

// New returns a store; now is the clock (time.Now in production).
func New(rdb redis.UniversalClient, now func() time.Time) *Store {
	return &Store{rdb: rdb, now: now}
}

// Hash is the hex SHA-256 of a raw key: its only stored form.
func Hash(raw string) string {
	sum := sha256.Sum256([]byte(raw))
	return hex.EncodeToString(sum[:])
}

// ValidFormat reports whether raw looks like a key this store issues.
func ValidFormat(raw string) bool { return formatRE.MatchString(raw) }

// Create issues a key and returns it raw, once, with its record.
func (s *Store) Create(ctx context.Context, userID, tier string, expiresAt time.Time) (string, Record, error) {
	var secret [32]byte
	var idb [8]byte
	if _, err := rand.Read(secret[:]); err != nil {
		return "", Record{}, fmt.Errorf("generate key: %w", err)
	}
	if _, err := rand.Read(idb[:]); err != nil {
		return "", Record{}, fmt.Errorf("generate key id: %w", err)
	}
	raw := Prefix + base64.RawURLEncoding.EncodeToString(secret[:])
	rec := Record{ID: "k_" + hex.EncodeToString(idb[:]), UserID: userID, Tier: tier, Status: StatusActive,
		CreatedAt: s.now().UTC().Truncate(time.Second), ExpiresAt: expiresAt.UTC()}
	h := Hash(raw)
	if err := s.rdb.HSet(ctx, keys.APIKey(h), toFields(rec)).Err(); err != nil {
		return "", Record{}, fmt.Errorf("store key: %w", err)
	}
	if err := s.rdb.Set(ctx, keys.APIKeyID(rec.ID), h, 0).Err(); err != nil {
		return "", Record{}, fmt.Errorf("store key id: %w", err)
	}
	return raw, rec, nil
}

// Lookup finds the record of a raw key.
func (s *Store) Lookup(ctx context.Context, raw string) (Record, error) {
	if !ValidFormat(raw) {
		return Record{}, ErrFormat
	}
	return s.byHash(ctx, Hash(raw))
}

// Get finds a record by key id.
func (s *Store) Get(ctx context.Context, id string) (Record, error) {
	h, err := s.rdb.Get(ctx, keys.APIKeyID(id)).Result()
	if errors.Is(err, redis.Nil) {
		return Record{}, ErrNotFound
	}
	if err != nil {
		return Record{}, fmt.Errorf("find key id: %w", err)
	}
	return s.byHash(ctx, h)
}

// Revoke marks a key revoked; revoking twice keeps the first time.
func (s *Store) Revoke(ctx context.Context, id string) (Record, error) {
	rec, err := s.Get(ctx, id)
	if err != nil {
		return Record{}, err
	}
	if rec.Status == StatusRevoked {
		return rec, nil
	}
	h, err := s.rdb.Get(ctx, keys.APIKeyID(id)).Result()
	if err != nil {
		return Record{}, fmt.Errorf("find key id: %w", err)
	}
	rec.Status, rec.RevokedAt = StatusRevoked, s.now().UTC().Truncate(time.Second)
	if err := s.rdb.HSet(ctx, keys.APIKey(h), toFields(rec)).Err(); err != nil {
		return Record{}, fmt.Errorf("revoke key: %w", err)
	}
	return rec, nil
}

func (s *Store) byHash(ctx context.Context, h string) (Record, error) {
	m, err := s.rdb.HGetAll(ctx, keys.APIKey(h)).Result()
	if err != nil {
		return Record{}, fmt.Errorf("find key: %w", err)
	}
	if len(m) == 0 {
		return Record{}, ErrNotFound
	}
	rec := Record{ID: m["id"], UserID: m["user_id"], Tier: m["tier"], Status: m["status"]}
	rec.CreatedAt = parseTime(m["created_at"])
	rec.ExpiresAt = parseTime(m["expires_at"])
	rec.RevokedAt = parseTime(m["revoked_at"])
	return rec, nil
}

func toFields(r Record) map[string]any {
	return map[string]any{
		"id": r.ID, "user_id": r.UserID, "tier": r.Tier, "status": r.Status,
		"created_at": formatTime(r.CreatedAt), "expires_at": formatTime(r.ExpiresAt), "revoked_at": formatTime(r.RevokedAt),
	}
}

func formatTime(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339)
}

func parseTime(s string) time.Time {
	t, _ := time.Parse(time.RFC3339, s)
	return t
}
