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
	"slices"
	"strconv"
	"sync"
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

// Store keeps key records.
type Store struct {
	records backend
	now     func() time.Time
}

// backend keeps the records by key hash, the key ids, and the listing
// indexes (by creation, all keys and each user's): Redis, or memory.
type backend interface {
	create(ctx context.Context, h string, rec Record) error
	save(ctx context.Context, h string, rec Record) error
	// hashOf finds the hash of a key id; byHash its record. ErrNotFound
	// when there is none.
	hashOf(ctx context.Context, id string) (string, error)
	byHash(ctx context.Context, h string) (Record, error)
	// page returns the key ids from position start of the index of userID
	// ("": every key), at most n; size is the index's length.
	page(ctx context.Context, userID string, start, n int64) ([]string, error)
	size(ctx context.Context, userID string) (int64, error)
}

// New returns a store in Redis; now is the clock (time.Now in production).
func New(rdb redis.UniversalClient, now func() time.Time) *Store {
	return &Store{records: redisRecords{rdb}, now: now}
}

// NewMemory returns a store in this process's memory (redis_enabled =
// false).
func NewMemory(now func() time.Time) *Store {
	return &Store{records: &memoryRecords{records: map[string]Record{}, hashes: map[string]string{}, byUser: map[string][]string{}}, now: now}
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
	if err := s.records.create(ctx, Hash(raw), rec); err != nil {
		return "", Record{}, err
	}
	return raw, rec, nil
}

// Lookup finds the record of a raw key.
func (s *Store) Lookup(ctx context.Context, raw string) (Record, error) {
	if !ValidFormat(raw) {
		return Record{}, ErrFormat
	}
	return s.records.byHash(ctx, Hash(raw))
}

// Get finds a record by key id.
func (s *Store) Get(ctx context.Context, id string) (Record, error) {
	h, err := s.records.hashOf(ctx, id)
	if err != nil {
		return Record{}, err
	}
	return s.records.byHash(ctx, h)
}

// Revoke marks a key revoked; revoking twice keeps the first time.
func (s *Store) Revoke(ctx context.Context, id string) (Record, error) {
	h, err := s.records.hashOf(ctx, id)
	if err != nil {
		return Record{}, err
	}
	rec, err := s.records.byHash(ctx, h)
	if err != nil {
		return Record{}, err
	}
	if rec.Status == StatusRevoked {
		return rec, nil
	}
	rec.Status, rec.RevokedAt = StatusRevoked, s.now().UTC().Truncate(time.Second)
	if err := s.records.save(ctx, h, rec); err != nil {
		return Record{}, err
	}
	return rec, nil
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
	now := s.now()
	var out []Record
	cursor := q.Cursor
	for scanned := 0; len(out) < q.Limit && scanned < maxScan; {
		ids, err := s.records.page(ctx, q.UserID, cursor, int64(q.Limit))
		if err != nil {
			return nil, 0, err
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
	if n, err := s.records.size(ctx, q.UserID); err == nil && cursor >= n {
		cursor = 0
	}
	return out, cursor, nil
}

type redisRecords struct{ rdb redis.UniversalClient }

func index(userID string) string {
	if userID != "" {
		return keys.APIKeyUser(userID)
	}
	return keys.APIKeyIndex
}

func (r redisRecords) create(ctx context.Context, h string, rec Record) error {
	if err := r.rdb.HSet(ctx, keys.APIKey(h), toFields(rec)).Err(); err != nil {
		return fmt.Errorf("store key: %w", err)
	}
	if err := r.rdb.Set(ctx, keys.APIKeyID(rec.ID), h, 0).Err(); err != nil {
		return fmt.Errorf("store key id: %w", err)
	}
	// The indexes list keys by creation; one write each, so on a cluster
	// they may sit in any slot. A key missing from them still works: only
	// the listing would not show it.
	score := float64(rec.CreatedAt.Unix())
	if err := r.rdb.ZAdd(ctx, index(""), redis.Z{Score: score, Member: rec.ID}).Err(); err != nil {
		return fmt.Errorf("index key: %w", err)
	}
	if err := r.rdb.ZAdd(ctx, index(rec.UserID), redis.Z{Score: score, Member: rec.ID}).Err(); err != nil {
		return fmt.Errorf("index key by user: %w", err)
	}
	return nil
}

func (r redisRecords) save(ctx context.Context, h string, rec Record) error {
	if err := r.rdb.HSet(ctx, keys.APIKey(h), toFields(rec)).Err(); err != nil {
		return fmt.Errorf("store key: %w", err)
	}
	return nil
}

func (r redisRecords) hashOf(ctx context.Context, id string) (string, error) {
	h, err := r.rdb.Get(ctx, keys.APIKeyID(id)).Result()
	if errors.Is(err, redis.Nil) {
		return "", ErrNotFound
	}
	if err != nil {
		return "", fmt.Errorf("find key id: %w", err)
	}
	return h, nil
}

func (r redisRecords) byHash(ctx context.Context, h string) (Record, error) {
	m, err := r.rdb.HGetAll(ctx, keys.APIKey(h)).Result()
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

func (r redisRecords) page(ctx context.Context, userID string, start, n int64) ([]string, error) {
	ids, err := r.rdb.ZRange(ctx, index(userID), start, start+n-1).Result()
	if err != nil {
		return nil, fmt.Errorf("list keys: %w", err)
	}
	return ids, nil
}

func (r redisRecords) size(ctx context.Context, userID string) (int64, error) {
	return r.rdb.ZCard(ctx, index(userID)).Result()
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

// memoryRecords keeps what Redis would, in creation order.
type memoryRecords struct {
	mu      sync.Mutex
	records map[string]Record   // by hash
	hashes  map[string]string   // key id -> hash
	all     []string            // key ids by creation
	byUser  map[string][]string // user id -> key ids by creation
}

func (m *memoryRecords) create(_ context.Context, h string, rec Record) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.records[h], m.hashes[rec.ID] = rec, h
	m.all = append(m.all, rec.ID)
	m.byUser[rec.UserID] = append(m.byUser[rec.UserID], rec.ID)
	return nil
}

func (m *memoryRecords) save(_ context.Context, h string, rec Record) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.records[h] = rec
	return nil
}

func (m *memoryRecords) hashOf(_ context.Context, id string) (string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	h, ok := m.hashes[id]
	if !ok {
		return "", ErrNotFound
	}
	return h, nil
}

func (m *memoryRecords) byHash(_ context.Context, h string) (Record, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	rec, ok := m.records[h]
	if !ok {
		return Record{}, ErrNotFound
	}
	return rec, nil
}

func (m *memoryRecords) index(userID string) []string {
	if userID != "" {
		return m.byUser[userID]
	}
	return m.all
}

func (m *memoryRecords) page(_ context.Context, userID string, start, n int64) ([]string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	ids := m.index(userID)
	if start < 0 || start >= int64(len(ids)) {
		return nil, nil
	}
	return slices.Clone(ids[start:min(start+n, int64(len(ids)))]), nil
}

func (m *memoryRecords) size(_ context.Context, userID string) (int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return int64(len(m.index(userID))), nil
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
