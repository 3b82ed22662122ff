package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/tollgate-rl/tollgate/controlsvc/internal/apierr"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/policy"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/store/apikeys"
	"github.com/tollgate-rl/tollgate/shared/identity"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// UserID is a user id given as a JSON string or a JSON integer (the seed
// sends numbers).
type UserID struct {
	Value  string
	Number bool
}

// UnmarshalJSON reads a string or an integer; anything else is refused as a
// type error, which the decoder places at its field.
func (u *UserID) UnmarshalJSON(b []byte) error {
	if len(b) > 0 && b[0] == '"' {
		u.Number = false
		return json.Unmarshal(b, &u.Value)
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var n json.Number
	if d.Decode(&n) != nil {
		return &json.UnmarshalTypeError{Value: "a non-number", Type: reflect.TypeFor[string]()}
	}
	if _, err := strconv.ParseInt(n.String(), 10, 64); err != nil {
		return &json.UnmarshalTypeError{Value: "number " + n.String(), Type: reflect.TypeFor[string]()}
	}
	u.Value, u.Number = n.String(), true
	return nil
}

// CreateKeyRequest asks for a new API key: the seed's body (tier_id) or a
// tier by name.
type CreateKeyRequest struct {
	UserID    UserID     `json:"user_id"`
	TierID    *int       `json:"tier_id"`
	Tier      string     `json:"tier"`
	ExpiresAt *time.Time `json:"expires_at"`
}

// KeyView is a key as the admin API shows it: never the raw key, except
// APIKey in the answer to its creation (and to a revocation that named it).
type KeyView struct {
	APIKey    string     `json:"api_key,omitempty"`
	KeyID     string     `json:"key_id"`
	UserID    any        `json:"user_id"`
	TierID    int        `json:"tier_id,omitempty"`
	TierName  string     `json:"tier_name"`
	Tier      string     `json:"tier"` // tier_name, under the name earlier answers used
	Status    string     `json:"status"`
	CreatedAt time.Time  `json:"created_at"`
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
	RevokedAt *time.Time `json:"revoked_at,omitempty"`
}

// KeyList is a page of keys.
type KeyList struct {
	Keys       []KeyView `json:"keys"`
	Count      int       `json:"count"`
	NextCursor string    `json:"next_cursor,omitempty"`
}

// readsBack reports whether a user id stored bare is read back as itself
// (a key's user_id is parsed again when the key is used).
func readsBack(uid identity.ID) bool {
	again, err := identity.Parse(uid.Value)
	return err == nil && again == uid
}

// CreateKey issues a key. An unknown tier is refused, never replaced by the
// default.
func (s *Service) CreateKey(ctx context.Context, req *CreateKeyRequest) (KeyView, error) {
	// Read as every identity is (identity.Parse): "user:bob" is bob, whom
	// user rules count with his own logins, not a user named "user:bob"
	// (an outsider's key for "user:bob" got bob's user-scope allowance
	// again); an address or a key is no user.
	uid, err := identity.Parse(req.UserID.Value)
	switch {
	case err != nil:
		return KeyView{}, apierr.Invalid("user_id", "must be 1..255 printable characters or an integer")
	case uid.Kind != identity.KindUser:
		return KeyView{}, apierr.Invalid("user_id", "names a user (bob or user:bob); "+string(uid.Kind)+": identities are not users")
	case !readsBack(uid):
		// Stored bare, it is read again when the key is used: user:user:bob
		// would then be bob.
		return KeyView{}, apierr.Invalid("user_id", "a user id may not itself begin with user:, ip: or key:")
	case strings.HasPrefix(uid.Value, identity.DigestPrefix):
		// The filter's name for a token subject it cannot show: a key's
		// user spelled so shared that subject's user counters (attack 57
		// B5).
		return KeyView{}, apierr.Invalid("user_id", "may not begin with "+identity.DigestPrefix+", which names token subjects that cannot be shown as they are")
	}
	req.UserID.Value = uid.Value
	p := s.live()
	var tier *policy.Tier
	switch {
	case req.TierID != nil && req.Tier != "":
		return KeyView{}, apierr.Invalid("tier", "give tier_id or tier, not both")
	case req.TierID != nil:
		if tier = p.TierByID(*req.TierID); tier == nil {
			return KeyView{}, apierr.Invalid("tier_id", fmt.Sprintf("%d is not a tier", *req.TierID))
		}
	case req.Tier != "":
		if tier = p.TierByName(req.Tier); tier == nil {
			return KeyView{}, apierr.Invalid("tier", strconv.Quote(req.Tier)+" is not a tier")
		}
	default:
		tier = p.TierByName(p.DefaultTier())
	}
	var expires time.Time
	if req.ExpiresAt != nil {
		if !req.ExpiresAt.After(s.now()) {
			return KeyView{}, apierr.Invalid("expires_at", "must be in the future")
		}
		expires = *req.ExpiresAt
	}
	raw, rec, err := s.keys.Create(ctx, req.UserID.Value, req.UserID.Number, tier.ID, tier.Name, expires)
	if err != nil {
		s.m.RedisErrors.WithLabelValues("api_key").Inc()
		return KeyView{}, apierr.Unavailable("could not store the key", err)
	}
	// The key id is logged, never the key.
	s.log.Info("api key created", "key_id", rec.ID, "user_id", rec.UserID, "tier", rec.Tier)
	v := s.keyView(&rec)
	s.audit(ctx, "api_key.create", rec.ID, nil, v) // before the raw key is added: never in the trail
	v.APIKey = raw
	return v, nil
}

// Key returns a key's record, by key id or by the raw key.
func (s *Service) Key(ctx context.Context, idOrKey string) (KeyView, error) {
	rec, err := s.findKey(ctx, idOrKey)
	if err != nil {
		return KeyView{}, err
	}
	return s.keyView(&rec), nil
}

// RevokeKey revokes a key named by its id or the raw key; revoking twice
// keeps the first time. A revoked key is refused by every replica at once,
// and by a filter once the lease it holds for the key's bucket runs out
// (lease.ttl_ms).
func (s *Service) RevokeKey(ctx context.Context, idOrKey string) (KeyView, error) {
	found, err := s.findKey(ctx, idOrKey)
	if err != nil {
		return KeyView{}, err
	}
	rec, err := s.keys.Revoke(ctx, found.ID)
	if err != nil {
		return KeyView{}, s.keyError(err)
	}
	v := s.keyView(&rec)
	// Revoking a revoked key changes nothing: answered the same, not
	// audited again (a loop of revokes must not fill the trail).
	if found.Status != apikeys.StatusRevoked {
		s.log.Info("api key revoked", "key_id", rec.ID)
		s.audit(ctx, "api_key.revoke", rec.ID, s.keyView(&found), v)
	}
	if apikeys.ValidFormat(idOrKey) {
		v.APIKey = idOrKey // the caller has it already
	}
	return v, nil
}

// MaxKeyPage bounds a page of the key listing.
const MaxKeyPage = 100

// Keys lists keys, oldest first, by user and status.
func (s *Service) Keys(ctx context.Context, userID, status, cursor, limit string) (KeyList, error) {
	q := apikeys.Query{UserID: userID, Status: status}
	switch status {
	case "", apikeys.StatusActive, apikeys.StatusRevoked, apikeys.StatusExpired:
	default:
		return KeyList{}, apierr.Invalid("status", "must be active, revoked or expired")
	}
	var aerr *apierr.Error
	if q.Limit, aerr = pageSize(limit, 50, MaxKeyPage); aerr != nil {
		return KeyList{}, aerr
	}
	if cursor != "" {
		n, err := strconv.ParseInt(cursor, 10, 64)
		if err != nil || n < 0 {
			return KeyList{}, apierr.Invalid("cursor", "must be a next_cursor of an earlier page")
		}
		q.Cursor = n
	}
	recs, next, err := s.keys.List(ctx, q)
	if err != nil {
		s.m.RedisErrors.WithLabelValues("api_key").Inc()
		return KeyList{}, apierr.Unavailable("could not list the keys", err)
	}
	out := KeyList{Keys: make([]KeyView, len(recs)), Count: len(recs)}
	for i := range recs {
		out.Keys[i] = s.keyView(&recs[i])
	}
	if next > 0 {
		out.NextCursor = strconv.FormatInt(next, 10)
	}
	return out, nil
}

// pageSize reads a listing's limit parameter: def when absent, 1..max.
func pageSize(raw string, def, max int) (int, *apierr.Error) {
	if raw == "" {
		return def, nil
	}
	n, err := strconv.Atoi(raw)
	if err != nil || n < 1 || n > max {
		return 0, apierr.Invalid("limit", fmt.Sprintf("must be in 1..%d", max))
	}
	return n, nil
}

// findKey resolves a key id or a raw key to its record.
func (s *Service) findKey(ctx context.Context, idOrKey string) (apikeys.Record, error) {
	var rec apikeys.Record
	var err error
	if apikeys.ValidFormat(idOrKey) {
		rec, err = s.keys.Lookup(ctx, idOrKey)
	} else {
		rec, err = s.keys.Get(ctx, idOrKey)
	}
	if err != nil {
		return apikeys.Record{}, s.keyError(err)
	}
	return rec, nil
}

func (s *Service) keyError(err error) error {
	if errors.Is(err, apikeys.ErrNotFound) {
		return apierr.New(apierr.KindNotFound, wire.CodeNotFound, "no API key with that id")
	}
	s.m.RedisErrors.WithLabelValues("api_key").Inc()
	return apierr.Unavailable("could not read the key", err)
}

func (s *Service) keyView(r *apikeys.Record) KeyView {
	p := s.live()
	name := p.KeyTier(r.TierID, r.Tier)
	v := KeyView{KeyID: r.ID, UserID: r.UserID, TierName: name, Tier: name, Status: r.StatusAt(s.now()), CreatedAt: r.CreatedAt}
	if r.UserIDNumber {
		if n, err := strconv.ParseInt(r.UserID, 10, 64); err == nil {
			v.UserID = n
		}
	}
	if t := p.TierByName(name); t != nil {
		v.TierID = t.ID
	}
	if !r.ExpiresAt.IsZero() {
		v.ExpiresAt = &r.ExpiresAt
	}
	if !r.RevokedAt.IsZero() {
		v.RevokedAt = &r.RevokedAt
	}
	return v
}
