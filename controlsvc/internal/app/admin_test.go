package app_test

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-rl/tollgate/controlsvc/internal/keys"
)

func redisZ(score float64, member string) redis.Z { return redis.Z{Score: score, Member: member} }

func TestAdminNeedsToken(t *testing.T) {
	s := startService(t, "", nil)
	body := map[string]any{"user_id": "x", "endpoint": "/x"}
	for _, hdr := range [][]string{nil, {"Authorization", "Bearer wrong"}, {"Authorization", "Bearer " + adminToken + "x"}, {"X-Admin-Token", ""}} {
		r := s.do("POST", "/v1/rate-limit/reset", body, hdr...)
		if r.status != http.StatusUnauthorized || r.errorCode(t) != "UNAUTHORIZED" {
			t.Fatalf("reset with %v: %d %s", hdr, r.status, r.body)
		}
	}
	if r := s.do("POST", "/v1/rate-limit/reset", body, "X-Admin-Token", adminToken); r.status != 200 {
		t.Fatalf("X-Admin-Token: %d %s", r.status, r.body)
	}
	off := startService(t, "", map[string]string{"TOLLGATE_ADMIN_TOKEN": ""})
	if r := off.admin("POST", "/v1/rate-limit/reset", body); r.status != http.StatusUnauthorized || !strings.Contains(string(r.body), "disabled") {
		t.Fatalf("admin API without a token configured: %d %s", r.status, r.body)
	}
}

func TestResetClearsCallerCounters(t *testing.T) {
	s := startService(t, "[[rules]]\nid = \"all\"\nscope = \"global\"\nalgorithm = \"fixed_window\"\nlimit = 1000\nwindow_seconds = 60\n", nil)
	req := map[string]any{"user_id": "resettable", "endpoint": "/x", "limit": 1, "window_seconds": 60}
	s.check(req)
	if r := s.check(req); r.status != 429 {
		t.Fatalf("precondition: %d", r.status)
	}
	r := s.admin("POST", "/v1/rate-limit/reset", map[string]any{"user_id": "resettable", "endpoint": "/x"})
	if r.status != 200 {
		t.Fatalf("reset: %d %s", r.status, r.body)
	}
	// The check's own limit counted on a counter of its own: the reset
	// clears it too, whatever window the check named.
	if r := s.check(req); r.status != 200 {
		t.Fatalf("after a reset, the check's own limit still refuses: %d %s", r.status, r.body)
	}
	// Reset follows the configured rules, not the check's ad-hoc limit: the
	// global rule is shared and must survive.
	if n := s.rdb.Exists(context.Background(), "rl:{global:*}:all:fixed_window:60").Val(); n != 0 {
		t.Fatalf("the global counter is counted by checks without a limit only; got %d", n)
	}
	s.check(map[string]any{"user_id": "resettable", "endpoint": "/x"})
	s.admin("POST", "/v1/rate-limit/reset", map[string]any{"user_id": "resettable", "endpoint": "/x"})
	if n := s.rdb.Exists(context.Background(), "rl:{global:*}:all:fixed_window:60").Val(); n != 1 {
		t.Fatal("reset of one caller deleted a global counter")
	}
}

func TestOverrideViaConfigAPI(t *testing.T) {
	s := startService(t, "", nil)
	put := map[string]any{"user_id": "user_123", "endpoint": "/api/v1/users", "limit": 2, "window_seconds": 60, "strategy": "token_bucket", "burst_capacity": 2}
	r := s.admin("PUT", "/v1/rate-limit/config", put)
	if r.status != 200 || r.json(t)["updated_at"] == nil {
		t.Fatalf("PUT config: %d %s", r.status, r.body)
	}
	codes := []int{}
	for i := 0; i < 3; i++ {
		codes = append(codes, s.check(map[string]any{"user_id": "user_123", "endpoint": "/api/v1/users"}).status)
	}
	if codes[0] != 200 || codes[1] != 200 || codes[2] != 429 {
		t.Fatalf("statuses with override 2: %v", codes)
	}
	for _, tt := range []struct {
		body map[string]any
		code string
	}{
		{map[string]any{"user_id": "u", "endpoint": "/x", "limit": 0, "window_seconds": 60, "strategy": "gcra"}, "INVALID_LIMIT"},
		{map[string]any{"user_id": "u", "endpoint": "/x", "limit": 5, "window_seconds": 60, "strategy": "leaky"}, "INVALID_STRATEGY"},
		{map[string]any{"user_id": "u", "endpoint": "/x", "limit": 5, "window_seconds": 60, "strategy": "gcra", "burst": 3}, "INVALID_INPUT"},
	} {
		if r := s.admin("PUT", "/v1/rate-limit/config", tt.body); r.status != 400 || r.errorCode(t) != tt.code {
			t.Errorf("%v: %d %s; want %s", tt.body, r.status, r.body, tt.code)
		}
	}
}

func TestAPIKeys(t *testing.T) {
	s := startService(t, "[[tiers]]\nname = \"free\"\nlimit = 10\nwindow_seconds = 60\n[[tiers]]\nname = \"premium\"\nlimit = 1000\nwindow_seconds = 60\n", nil)
	created := s.admin("POST", "/admin/v1/api-keys", map[string]any{"user_id": "42", "tier": "premium"})
	if created.status != http.StatusCreated {
		t.Fatalf("create: %d %s", created.status, created.body)
	}
	m := created.json(t)
	raw, id := m["api_key"].(string), m["key_id"].(string)
	if !strings.HasPrefix(raw, "ak_live_") || !strings.HasPrefix(id, "k_") {
		t.Fatalf("created %s", created.body)
	}
	// Stored hashed: the raw key appears in no Redis key or value.
	ctx := context.Background()
	for _, k := range s.rdb.Keys(ctx, "*").Val() {
		dump := k
		switch s.rdb.Type(ctx, k).Val() {
		case "hash":
			for f, v := range s.rdb.HGetAll(ctx, k).Val() {
				dump += f + v
			}
		case "string":
			dump += s.rdb.Get(ctx, k).Val()
		case "zset":
			dump += strings.Join(s.rdb.ZRange(ctx, k, 0, -1).Val(), " ")
		}
		if strings.Contains(dump, raw) || strings.Contains(dump, raw[len("ak_live_"):]) {
			t.Fatalf("raw key stored in %s", k)
		}
	}
	// Shown once: reading it back never returns the key.
	got := s.admin("GET", "/admin/v1/api-keys/"+id, nil)
	if got.status != 200 || strings.Contains(string(got.body), raw) || got.json(t)["tier"] != "premium" {
		t.Fatalf("get: %d %s", got.status, got.body)
	}
	r := s.check(map[string]any{"user_id": "ip:203.0.113.9", "endpoint": "/x", "api_key": raw})
	if r.status != 200 || r.json(t)["identity"] != "key:"+id || num(t, r.json(t), "limit") != 1000 {
		t.Fatalf("check with key: %d %s", r.status, r.body)
	}
	// A verified JWT subject presenting the key: the key is charged (its
	// counter moves), so its tier is never borrowed for free.
	if r := s.check(map[string]any{"user_id": "user:alice", "endpoint": "/x", "api_key": raw}); r.json(t)["identity"] != "key:"+id || num(t, r.json(t), "remaining") != 998 {
		t.Fatalf("jwt + key: %s", r.body)
	}
	for _, tt := range []struct {
		key    string
		status int
		code   string
	}{
		{"invalid123", 400, "INVALID_API_KEY"},
		{"tg_" + strings.Repeat("A", 43), 401, "INVALID_API_KEY"},
	} {
		r := s.check(map[string]any{"user_id": "ip:203.0.113.9", "endpoint": "/x", "api_key": tt.key})
		if r.status != tt.status || r.errorCode(t) != tt.code {
			t.Errorf("key %q: %d %s", tt.key, r.status, r.body)
		}
	}
	if r := s.admin("POST", "/admin/v1/api-keys/"+id+"/revoke", nil); r.status != 200 || r.json(t)["status"] != "revoked" {
		t.Fatalf("revoke: %d %s", r.status, r.body)
	}
	r = s.check(map[string]any{"user_id": "ip:203.0.113.9", "endpoint": "/x", "api_key": raw})
	if r.status != 403 || r.errorCode(t) != "API_KEY_REVOKED" {
		t.Fatalf("revoked key: %d %s", r.status, r.body)
	}
	// Revoking again answers the same and is not audited again.
	trailLen := func() int64 { return s.rdb.XLen(ctx, keys.Audit).Val() }
	before := trailLen()
	if r := s.admin("POST", "/admin/v1/api-keys/"+raw+"/revoke", nil); r.status != 200 || r.json(t)["status"] != "revoked" {
		t.Fatalf("revoke again: %d %s", r.status, r.body)
	}
	if after := trailLen(); after != before {
		t.Fatalf("a second revoke added %d audit entries", after-before)
	}
	if r := s.admin("POST", "/admin/v1/api-keys/k_nope/revoke", nil); r.status != 404 || r.errorCode(t) != "NOT_FOUND" {
		t.Fatalf("unknown key id: %d %s", r.status, r.body)
	}
	// An expired key: stored with a past expiry.
	created = s.admin("POST", "/admin/v1/api-keys", map[string]any{"user_id": "43", "expires_at": time.Now().Add(time.Hour).Format(time.RFC3339)})
	raw2 := created.json(t)["api_key"].(string)
	h := s.rdb.Get(ctx, "rl:apikeyid:"+created.json(t)["key_id"].(string)).Val()
	s.rdb.HSet(ctx, "rl:apikey:"+h, "expires_at", time.Now().Add(-time.Minute).UTC().Format(time.RFC3339))
	r = s.check(map[string]any{"user_id": "ip:203.0.113.9", "endpoint": "/x", "api_key": raw2})
	if r.status != 403 || r.errorCode(t) != "API_KEY_EXPIRED" {
		t.Fatalf("expired key: %d %s", r.status, r.body)
	}
	// Secrets never reach the logs.
	logs := s.logs.String()
	for _, secret := range []string{raw, raw2, adminToken} {
		if strings.Contains(logs, secret) {
			t.Fatalf("a secret reached the logs")
		}
	}
	if !strings.Contains(logs, id) {
		t.Fatal("key creation was not logged by id")
	}
}

func TestReloadKeepsOldConfigOnError(t *testing.T) {
	s := startService(t, "[[tiers]]\nname = \"free\"\nlimit = 100\nwindow_seconds = 60\n", nil)
	limitOf := func(user string) int64 {
		return num(t, s.check(map[string]any{"user_id": user, "endpoint": "/x"}).json(t), "limit")
	}
	if got := limitOf("a"); got != 100 {
		t.Fatalf("limit %d", got)
	}
	// A changed file is picked up by the watcher...
	if err := s.app.WatchConfig(t.Context()); err != nil {
		t.Fatal(err)
	}
	writeFile(t, s.cfgPath, "[[tiers]]\nname = \"free\"\nlimit = 7\nwindow_seconds = 60\n")
	if err := awaitReload(t, s); err != nil {
		t.Fatalf("reload: %v", err)
	}
	if got := limitOf("b"); got != 7 {
		t.Fatalf("after reload: limit %d, want 7", got)
	}
	// ...and a bad one is refused, counted, and the old config stays live.
	writeFile(t, s.cfgPath, "[[tiers]]\nname = \"free\"\nlimit = -1\nwindow_seconds = 60\n")
	if err := awaitReload(t, s); err == nil || !strings.Contains(err.Error(), "tiers[0].limit") {
		t.Fatalf("bad reload error: %v", err)
	}
	if got := limitOf("c"); got != 7 {
		t.Fatalf("after a bad reload: limit %d, want the old 7", got)
	}
	if metricValue(t, s, `tollgate_config_reloads_total{result="failure"}`) < 1 {
		t.Fatal("failed reload not counted")
	}
}

// awaitReload waits for the watcher's reload; a write may produce several
// events, so it takes the last result that arrives before things go quiet.
func awaitReload(t *testing.T, s *service) error {
	t.Helper()
	var err error
	select {
	case err = <-s.reloads:
	case <-time.After(10 * time.Second):
		t.Fatal("no reload within 10s of a config change")
	}
	for {
		select {
		case err = <-s.reloads:
		case <-time.After(200 * time.Millisecond):
			return err
		}
	}
}

func writeFile(t *testing.T, path, body string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
}

// A request that shows no credential closes its connection after its
// answer; one that shows a valid one keeps it for the next. Anyone who
// reaches the port could otherwise hold connections idle for the idle
// timeout with one /health each (an outsider's attack held 7,466 of a
// listener's 7,500 from two addresses).
func TestUncredentialedConnectionsClose(t *testing.T) {
	s := startService(t, "", nil)
	addr := strings.TrimPrefix(s.base, "http://")
	for _, tc := range []struct {
		name, request string
		kept          bool
	}{
		{"health", "GET /health HTTP/1.1\r\nHost: x\r\n\r\n", false},
		{"a refused admin request", "GET /admin/v1/rules HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer wrong\r\n\r\n", false},
		{"an admin request", "GET /admin/v1/rules HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + adminToken + "\r\n\r\n", true},
		{"a decision status", "GET /v1/rate-limit/status/ip:192.0.2.1/x HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + decisionToken + "\r\n\r\n", true},
		// net/http answers OPTIONS * itself unless told not to: an
		// outsider held a listener with it, 34 bytes every 2 minutes.
		{"OPTIONS *", "OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n", false},
	} {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(5 * time.Second))
		br := bufio.NewReader(c)
		for i := range 2 {
			if _, err := io.WriteString(c, tc.request); err != nil {
				if !tc.kept && i == 1 {
					break
				}
				t.Fatal(err)
			}
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				if !tc.kept && i == 1 {
					break // closed after the first answer
				}
				t.Fatalf("%s, request %d: %v", tc.name, i+1, err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.Close == tc.kept {
				t.Fatalf("%s: Connection: close %v, want %v", tc.name, resp.Close, !tc.kept)
			}
			if !tc.kept {
				if _, err := br.ReadByte(); err != io.EOF {
					t.Fatalf("%s: the connection stayed open (%v)", tc.name, err)
				}
				break
			}
		}
		c.Close()
	}
}

// A request head past maxHeaderBytes is refused (431) and its connection
// closed: net/http's default let each connection hold 1 MiB of unfinished
// head for ReadHeaderTimeout (an outsider's 1,000 connections from one
// address held a gigabyte and kept the collector busy).
func TestLongRequestHeadsRefused(t *testing.T) {
	s := startService(t, "", nil)
	c, err := net.Dial("tcp", strings.TrimPrefix(s.base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	head := "GET /health HTTP/1.1\r\nHost: x\r\n" + strings.Repeat("X-Pad: "+strings.Repeat("a", 1000)+"\r\n", 100) + "\r\n"
	if _, err := io.WriteString(c, head); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("a %d-byte head: %d", len(head), resp.StatusCode)
	}
}
