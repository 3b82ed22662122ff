package app_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"
	"time"
)

// API keys in the seed's shape: a numeric user_id and tier_id, the ak_live_
// format, revocation by the raw key, a paged listing, expired keys read as
// expired, and keys of the old tg_ format keep working.
func TestAPIKeysInTheSeedShape(t *testing.T) {
	s := startService(t, "", nil)
	r := s.admin("POST", "/admin/v1/api-keys", map[string]any{"user_id": 42, "tier_id": 2, "expires_at": time.Now().Add(time.Hour).UTC().Format(time.RFC3339)})
	m := r.json(t)
	raw, _ := m["api_key"].(string)
	if r.status != 201 || !strings.HasPrefix(raw, "ak_live_") || len(raw) < len("ak_live_")+22 || m["user_id"] != 42.0 ||
		m["tier_id"] != 2.0 || m["tier_name"] != "premium" || m["status"] != "active" || m["created_at"] == nil || m["expires_at"] == nil || m["key_id"] == nil {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	for _, tt := range []struct {
		body  map[string]any
		field string
	}{
		{map[string]any{"user_id": 7, "tier_id": 99}, "tier_id"},
		{map[string]any{"user_id": 7, "tier": "gold"}, "tier"},
		{map[string]any{"user_id": 7.5}, "user_id"},
		{map[string]any{"user_id": true}, "user_id"},
		{map[string]any{"user_id": 7, "expires_at": "2001-01-01T00:00:00Z"}, "expires_at"},
	} {
		r := s.admin("POST", "/admin/v1/api-keys", tt.body)
		f, _ := r.json(t)["error"].(map[string]any)["details"].(map[string]any)["field"].(string)
		if r.status != 400 || f != tt.field {
			t.Errorf("create %v: %d %s; want 400 naming %s", tt.body, r.status, r.body, tt.field)
		}
	}
	// Three more keys for user 7, one of them revoked by its raw key.
	var raws []string
	for i := 0; i < 3; i++ {
		raws = append(raws, s.admin("POST", "/admin/v1/api-keys", map[string]any{"user_id": "7"}).json(t)["api_key"].(string))
	}
	rv := s.admin("POST", "/admin/v1/api-keys/"+raws[1]+"/revoke", nil)
	if rv.status != 200 || rv.json(t)["status"] != "revoked" || rv.json(t)["revoked_at"] == nil {
		t.Fatalf("revoke by raw key: %d %s", rv.status, rv.body)
	}
	page := s.admin("GET", "/admin/v1/api-keys?user_id=7&limit=2", nil)
	pm := page.json(t)
	if page.status != 200 || pm["count"] != 2.0 || pm["next_cursor"] == nil || strings.Contains(string(page.body), "ak_live_") {
		t.Fatalf("first page: %d %s", page.status, page.body)
	}
	rest := s.admin("GET", fmt.Sprintf("/admin/v1/api-keys?user_id=7&limit=2&cursor=%v", pm["next_cursor"]), nil).json(t)
	if rest["count"] != 1.0 || rest["next_cursor"] != nil {
		t.Fatalf("second page: %v", rest)
	}
	if revoked := s.admin("GET", "/admin/v1/api-keys?status=revoked", nil).json(t); revoked["count"] != 1.0 {
		t.Fatalf("revoked keys: %v", revoked)
	}
	for _, q := range []string{"?status=lost", "?limit=0", "?limit=101", "?cursor=-1"} {
		if r := s.admin("GET", "/admin/v1/api-keys"+q, nil); r.status != 400 {
			t.Errorf("list%s: %d %s", q, r.status, r.body)
		}
	}
	// Expired: the stored expiry passed; the key reads expired and is refused.
	ctx := context.Background()
	h := sha256.Sum256([]byte(raw))
	s.rdb.HSet(ctx, "rl:apikey:"+hex.EncodeToString(h[:]), "expires_at", time.Now().Add(-time.Minute).UTC().Format(time.RFC3339))
	if g := s.admin("GET", "/admin/v1/api-keys/"+m["key_id"].(string), nil).json(t); g["status"] != "expired" {
		t.Fatalf("expired key reads %v", g["status"])
	}
	if c := s.check(map[string]any{"user_id": "ip:192.0.2.7", "endpoint": "/x", "api_key": raw}); c.status != 403 || c.errorCode(t) != "API_KEY_EXPIRED" {
		t.Fatalf("expired key: %d %s", c.status, c.body)
	}
	// A key of the old format, stored as the old service stored it.
	legacy := "tg_" + strings.Repeat("L", 43)
	lh := sha256.Sum256([]byte(legacy))
	s.rdb.HSet(ctx, "rl:apikey:"+hex.EncodeToString(lh[:]), map[string]any{"id": "k_legacy", "user_id": "old", "tier": "premium", "status": "active", "created_at": "2025-01-01T00:00:00Z"})
	if c := s.check(map[string]any{"user_id": "ip:192.0.2.7", "endpoint": "/x", "api_key": legacy}); c.status != 200 || c.json(t)["identity"] != "key:k_legacy" {
		t.Fatalf("legacy key: %d %s", c.status, c.body)
	}
	// A malformed key is named by a masked prefix only.
	bad := "not-a-key-but-a-secret-0123456789"
	c := s.check(map[string]any{"user_id": "ip:192.0.2.7", "endpoint": "/x", "api_key": bad})
	prov, _ := c.json(t)["error"].(map[string]any)["details"].(map[string]any)["provided_key"].(string)
	if c.status != 400 || c.errorCode(t) != "INVALID_API_KEY" || prov == "" || len(prov) > 15 || strings.Contains(string(c.body), bad[:12]) {
		t.Fatalf("malformed key: %d %s", c.status, c.body)
	}
}

// A tier or a path configured to require a key refuses a caller without one
// (401 MISSING_API_KEY). The refused request counts for its address, as an
// anonymous one would; a caller known only by a JWT subject is refused
// without counting.
func TestMissingAPIKey(t *testing.T) {
	s := startService(t, "api_key_required_paths = [\"/api/v1/partner/**\"]\n"+
		"[[tiers]]\nname = \"free\"\nlimit = 10\nwindow_seconds = 60\n[[tiers]]\nname = \"partner\"\nlimit = 10\nwindow_seconds = 60\nrequire_api_key = true\n", nil)
	for _, body := range []map[string]any{
		{"user_id": "ip:192.0.2.1", "endpoint": "/api/v1/partner/orders"},
		{"user_id": "user:bob", "endpoint": "/api/v1/items", "tier": "partner"},
	} {
		if r := s.check(body); r.status != 401 || r.errorCode(t) != "MISSING_API_KEY" {
			t.Errorf("%v: %d %s", body, r.status, r.body)
		}
	}
	// The address's tier counts it: the path's counter and the tier's total.
	if keys, _ := s.rdb.Keys(context.Background(), "rl:{*").Result(); len(keys) != 2 || !strings.Contains(keys[0], "{identity:ip:192.0.2.1}") || !strings.Contains(keys[1], "{identity:ip:192.0.2.1}") {
		t.Fatalf("refused checks wrote %v; want the address's counters only", keys)
	}
	raw := s.admin("POST", "/admin/v1/api-keys", map[string]any{"user_id": "p1", "tier": "partner"}).json(t)["api_key"].(string)
	if r := s.check(map[string]any{"user_id": "ip:192.0.2.1", "endpoint": "/api/v1/partner/orders", "api_key": raw}); r.status != 200 {
		t.Fatalf("with a key: %d %s", r.status, r.body)
	}
	if r := s.check(map[string]any{"user_id": "ip:192.0.2.1", "endpoint": "/api/v1/items"}); r.status != 200 {
		t.Fatalf("a path that needs no key: %d %s", r.status, r.body)
	}
}

// A key's user_id is read as every identity is: a key made for "user:bob"
// is bob's, and user rules count its requests with bob's own (an
// outsider's key for "user:bob" got a user-scope allowance of its own); an
// address or a key id is no user.
func TestAPIKeyUserIsReadAsAnIdentity(t *testing.T) {
	s := startService(t, `
[[tiers]]
name = "free"
limit = 1000
window_seconds = 60

[[rules]]
id = "per_user"
path = "/x"
scope = "user"
algorithm = "fixed_window"
limit = 3
window_seconds = 60
`, nil)
	created := s.admin("POST", "/admin/v1/api-keys", map[string]any{"user_id": "user:bob"})
	raw, _ := created.json(t)["api_key"].(string)
	if created.status != 201 || created.json(t)["user_id"] != "bob" {
		t.Fatalf("create for user:bob: %d %s", created.status, created.body)
	}
	for i := range 3 {
		if c := s.check(map[string]any{"user_id": "user:bob", "endpoint": "/x"}); c.status != 200 {
			t.Fatalf("bob's login %d: %d %s", i+1, c.status, c.body)
		}
	}
	if c := s.check(map[string]any{"user_id": "ip:192.0.2.7", "endpoint": "/x", "api_key": raw}); c.status != 429 {
		t.Fatalf("bob's key after bob's three: %d %s; want 429 (one user)", c.status, c.body)
	}
	// A key made before, its user_id stored as typed, reads the same.
	old := "ak_live_" + strings.Repeat("C", 43)
	oh := sha256.Sum256([]byte(old))
	s.rdb.HSet(context.Background(), "rl:apikey:"+hex.EncodeToString(oh[:]), map[string]any{"id": "k_carol", "user_id": "user:carol", "tier": "free", "status": "active", "created_at": "2026-01-01T00:00:00Z"})
	for i := range 3 {
		if c := s.check(map[string]any{"user_id": "user:carol", "endpoint": "/x"}); c.status != 200 {
			t.Fatalf("carol's login %d: %d %s", i+1, c.status, c.body)
		}
	}
	if c := s.check(map[string]any{"user_id": "ip:192.0.2.8", "endpoint": "/x", "api_key": old}); c.status != 429 {
		t.Fatalf("carol's older key after carol's three: %d %s; want 429 (one user)", c.status, c.body)
	}
	// A key stored before its user's characters were refused (a Hangul
	// filler) is still that user's: counted under the name the filter
	// gives the same subject in a token (~sha256: and its digest), where
	// it had fallen out of the user's limit (attack 55 F3).
	legacy := "ak_live_" + strings.Repeat("D", 43)
	lh := sha256.Sum256([]byte(legacy))
	s.rdb.HSet(context.Background(), "rl:apikey:"+hex.EncodeToString(lh[:]), map[string]any{"id": "k_dave", "user_id": "dave\u3164", "tier": "free", "status": "active", "created_at": "2026-01-01T00:00:00Z"})
	sum := sha256.Sum256([]byte("dave\u3164"))
	tokenUser := "user:~sha256:" + hex.EncodeToString(sum[:16])
	for i := range 3 {
		if c := s.check(map[string]any{"user_id": tokenUser, "endpoint": "/x"}); c.status != 200 {
			t.Fatalf("dave's token request %d: %d %s", i+1, c.status, c.body)
		}
	}
	if c := s.check(map[string]any{"user_id": "ip:192.0.2.9", "endpoint": "/x", "api_key": legacy}); c.status != 429 {
		t.Fatalf("dave's older key after his three token requests: %d %s; want 429 (one user)", c.status, c.body)
	}
	// The filter's name for a token subject it cannot show is no key's
	// user: it shared that subject's counters (attack 57 B5).
	for _, id := range []string{"ip:192.0.2.7", "key:k_0123456789abcdef", "user:", "user:a\nb", "user:user:bob", "user:ip:192.0.2.7",
		"~sha256:0123456789abcdef0123456789abcdef", "user:~sha256:0123456789abcdef0123456789abcdef"} {
		r := s.admin("POST", "/admin/v1/api-keys", map[string]any{"user_id": id})
		f, _ := r.json(t)["error"].(map[string]any)["details"].(map[string]any)["field"].(string)
		if r.status != 400 || f != "user_id" {
			t.Errorf("create for %q: %d %s; want 400 naming user_id", id, r.status, r.body)
		}
	}
}
