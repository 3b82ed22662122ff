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
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-rl/tollgate/controlsvc/internal/keys"
)

// Prefix starts every raw key issued now, so that leaked keys are easy to
// scan for. Keys issued before it (LegacyPrefix) keep working.
const (
	Prefix       = "ak_live_"
	LegacyPrefix = "tg_"
)

// Format is the format the service tells a caller whose key does not match.
const Format = Prefix + "<43 characters>"

var formatRE = regexp.MustCompile(`^(ak_live_|tg_)[A-Za-z0-9_-]{43}$`)

// Errors of look-ups.
var (
	ErrFormat   = errors.New("api key format is invalid")
	ErrNotFound = errors.New("api key not found")
)

// Status of a key. Expired is never stored: a key reads expired once its
// expiry has passed.
const (
	StatusActive  = "active"
	StatusRevoked = "revoked"
	StatusExpired = "expired"
)

// Record is what is stored about a key; never the key itself.
type Record struct {
	ID     string `json:"key_id"`
	UserID string `json:"user_id"`
	// UserIDNumber is true when the user id was given as a JSON number: it
	// is shown back as one.
	UserIDNumber bool `json:"-"`
	// TierID is the tier the key was issued for, by id: renaming the tier
	// keeps its keys, and a new tier taking an old name does not inherit
	// them. 0 for keys issued before ids were kept (Tier, the name then,
	// decides for those).
	TierID    int       `json:"tier_id,omitempty"`
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

// StatusAt is the key's status at now: expired once its expiry passed.
func (r *Record) StatusAt(now time.Time) string {
	if r.Status == StatusActive && r.Expired(now) {
		return StatusExpired
	}
	return r.Status
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
func (s *Store) Create(ctx context.Context, userID string, userIDNumber bool, tierID int, tier string, expiresAt time.Time) (string, Record, error) {
	var secret [32]byte
	var idb [8]byte
	if _, err := rand.Read(secret[:]); err != nil {
		return "", Record{}, fmt.Errorf("generate key: %w", err)
	}
	if _, err := rand.Read(idb[:]); err != nil {
		return "", Record{}, fmt.Errorf("generate key id: %w", err)
	}
	raw := Prefix + base64.RawURLEncoding.EncodeToString(secret[:])
	rec := Record{ID: "k_" + hex.EncodeToString(idb[:]), UserID: userID, UserIDNumber: userIDNumber, TierID: tierID, Tier: tier, Status: StatusActive,
		CreatedAt: s.now().UTC().Truncate(time.Second), ExpiresAt: expiresAt.UTC()}
	h := Hash(raw)
	if err := s.rdb.HSet(ctx, keys.APIKey(h), toFields(rec)).Err(); err != nil {
		return "", Record{}, fmt.Errorf("store key: %w", err)
	}
	if err := s.rdb.Set(ctx, keys.APIKeyID(rec.ID), h, 0).Err(); err != nil {
		return "", Record{}, fmt.Errorf("store key id: %w", err)
	}
	// The indexes list keys by creation; one write each, so on a cluster
	// they may sit in any slot. A key missing from them still works: only
	// the listing would not show it.
	score := float64(rec.CreatedAt.Unix())
	if err := s.rdb.ZAdd(ctx, keys.APIKeyIndex, redis.Z{Score: score, Member: rec.ID}).Err(); err != nil {
		return "", Record{}, fmt.Errorf("index key: %w", err)
	}
	if err := s.rdb.ZAdd(ctx, keys.APIKeyUser(userID), redis.Z{Score: score, Member: rec.ID}).Err(); err != nil {
		return "", Record{}, fmt.Errorf("index key by user: %w", err)
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
	rec := Record{ID: m["id"], UserID: m["user_id"], UserIDNumber: m["user_id_number"] == "1", Tier: m["tier"], Status: m["status"]}
	rec.TierID, _ = strconv.Atoi(m["tier_id"])
	rec.CreatedAt = parseTime(m["created_at"])
	rec.ExpiresAt = parseTime(m["expires_at"])
	rec.RevokedAt = parseTime(m["revoked_at"])
	return rec, nil
}

func toFields(r Record) map[string]any {
	return map[string]any{
		"id": r.ID, "user_id": r.UserID, "user_id_number": boolField(r.UserIDNumber), "tier_id": strconv.Itoa(r.TierID), "tier": r.Tier, "status": r.Status,
		"created_at": formatTime(r.CreatedAt), "expires_at": formatTime(r.ExpiresAt), "revoked_at": formatTime(r.RevokedAt),
	}
}

func boolField(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

// Query selects keys to list.
type Query struct {
	UserID string // "" for every user
	Status string // "" for every status (as StatusAt reads it)
	// Cursor is where the page starts (0: the first); Limit its size.
	Cursor int64
	Limit  int
}

// maxScan bounds the index entries one listing reads while filtering by
// status, however few match.
const maxScan = 2000

// List returns a page of key records, oldest first, and the cursor of the
// next page (0: no more).
func (s *Store) List(ctx context.Context, q Query) ([]Record, int64, error) {
	index := keys.APIKeyIndex
	if q.UserID != "" {
		index = keys.APIKeyUser(q.UserID)
	}
	now := s.now()
	var out []Record
	cursor := q.Cursor
	for scanned := 0; len(out) < q.Limit && scanned < maxScan; {
		ids, err := s.rdb.ZRange(ctx, index, cursor, cursor+int64(q.Limit)-1).Result()
		if err != nil {
			return nil, 0, fmt.Errorf("list keys: %w", err)
		}
		if len(ids) == 0 {
			return out, 0, nil
		}
		for _, id := range ids {
			cursor++
			scanned++
			rec, err := s.Get(ctx, id)
			if errors.Is(err, ErrNotFound) {
				continue
			}
			if err != nil {
				return nil, 0, err
			}
			if q.Status != "" && rec.StatusAt(now) != q.Status {
				continue
			}
			out = append(out, rec)
			if len(out) == q.Limit {
				break
			}
		}
	}
	if n, err := s.rdb.ZCard(ctx, index).Result(); err == nil && cursor >= n {
		cursor = 0
	}
	return out, cursor, nil
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
