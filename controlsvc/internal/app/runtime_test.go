package app_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/controlsvc/internal/keys"
	"github.com/tollgate-rl/tollgate/testkit/redistest"
	"github.com/tollgate-rl/tollgate/testkit/windowtest"
)

// replicas starts n control services on one Redis. Their version check is
// a minute apart, so a change that reaches one within the test's wait came
// through the announcement, not the backstop.
func replicas(t *testing.T, n int, toml string) []*service {
	t.Helper()
	r := redistest.Start(t)
	out := make([]*service, n)
	for i := range out {
		out[i] = startServiceOn(t, r, "redis://"+r.Addr+"/0", toml, map[string]string{"TOLLGATE_OVERRIDE_REFRESH_MS": "60000"})
	}
	return out
}

// awaitVersion waits until s has applied the shared version Redis holds now.
func awaitVersion(t *testing.T, s *service) {
	t.Helper()
	want, err := s.rdb.Get(context.Background(), keys.AdminVersion).Int64()
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.After(10 * time.Second) // a bound on a hang, not a speed target
	for {
		select {
		case v := <-s.applied:
			if v >= want {
				return
			}
		case <-deadline:
			t.Fatalf("replica never applied shared version %d", want)
		}
	}
}

// A rule created on one replica decides the next request on another.
func TestRuleCreatedOnOneReplicaDecidesOnTheOther(t *testing.T) {
	windowtest.RoomInMinute(t)
	rs := replicas(t, 2, "")
	a, b := rs[0], rs[1]
	r := a.admin("POST", "/admin/v1/rate-limit-rules", map[string]any{
		"tier_id": 1, "endpoint_pattern": "/api/v1/uploads", "algorithm": "fixed_window", "limit": 1, "window_seconds": 60})
	if r.status != 201 {
		t.Fatalf("create rule: %d %s", r.status, r.body)
	}
	awaitVersion(t, b)
	id := fmt.Sprint(r.json(t)["rule_id"])
	req := map[string]any{"user_id": "uploader", "endpoint": "/api/v1/uploads"}
	if first, second := b.check(req), b.check(req); first.status != 200 || second.status != 429 || second.json(t)["rule_id"] != id {
		t.Fatalf("replica b after the rule: %d then %d %s", first.status, second.status, second.body)
	}
	// Deleted on b, gone on a.
	if d := b.admin("DELETE", "/admin/v1/rate-limit-rules/"+id, nil); d.status != 204 {
		t.Fatalf("delete: %d %s", d.status, d.body)
	}
	awaitVersion(t, a)
	if c := a.check(map[string]any{"user_id": "uploader2", "endpoint": "/api/v1/uploads"}); c.status != 200 || c.json(t)["rule_id"] == id {
		t.Fatalf("replica a still decides with the deleted rule: %s", c.body)
	}
}

// The rules API in the seed's shape, and what it refuses.
func TestRuleAPI(t *testing.T) {
	windowtest.RoomInMinute(t)
	s := startService(t, "[[rules]]\nid = \"login\"\npath = \"/api/v1/auth/login\"\nscope = \"ip\"\nalgorithm = \"fixed_window\"\nlimit = 5\nwindow_seconds = 60\n", nil)
	create := s.admin("POST", "/admin/v1/rate-limit-rules", map[string]any{
		"tier_id": 1, "endpoint_pattern": "/api/v1/uploads", "algorithm": "token_bucket", "limit": 50, "window_seconds": 60, "priority": 50})
	m := create.json(t)
	if create.status != 201 || m["tier_id"] != 1.0 || m["endpoint_pattern"] != "/api/v1/uploads" || m["is_active"] != true || m["created_at"] == nil || m["read_only"] != false {
		t.Fatalf("create: %d %s", create.status, create.body)
	}
	id := fmt.Sprint(m["rule_id"])
	if _, ok := m["rule_id"].(float64); !ok {
		t.Fatalf("rule_id is not a number: %s", create.body)
	}
	list := s.admin("GET", "/admin/v1/rate-limit-rules?tier_id=1", nil).json(t)
	if list["total"] != 2.0 || list["tier_name"] != "free" {
		t.Fatalf("list for tier 1: %v", list)
	}
	up := s.admin("PUT", "/admin/v1/rate-limit-rules/"+id, map[string]any{"limit": 75, "is_active": true})
	if um := up.json(t); up.status != 200 || um["limit"] != 75.0 || um["endpoint_pattern"] != "/api/v1/uploads" || um["priority"] != 50.0 {
		t.Fatalf("partial update: %d %s", up.status, up.body)
	}
	for _, tt := range []struct {
		method, path string
		body         any
		status       int
		code, field  string
	}{
		{"PUT", "/admin/v1/rate-limit-rules/login", map[string]any{"limit": 9}, 409, "READ_ONLY", ""},
		{"DELETE", "/admin/v1/rate-limit-rules/login", nil, 409, "READ_ONLY", ""},
		{"PUT", "/admin/v1/rate-limit-rules/999", map[string]any{"limit": 9}, 404, "NOT_FOUND", ""},
		{"POST", "/admin/v1/rate-limit-rules", map[string]any{"endpoint_pattern": "/x", "algorithm": "leaky", "limit": 1, "window_seconds": 60}, 400, "INVALID_STRATEGY", "algorithm"},
		{"POST", "/admin/v1/rate-limit-rules", map[string]any{"endpoint_pattern": "api", "limit": 1, "window_seconds": 60}, 400, "INVALID_INPUT", "endpoint_pattern"},
		{"POST", "/admin/v1/rate-limit-rules", map[string]any{"endpoint_pattern": "/x/", "limit": 1, "window_seconds": 60}, 400, "INVALID_INPUT", "endpoint_pattern"},
		{"POST", "/admin/v1/rate-limit-rules", map[string]any{"endpoint_pattern": "", "limit": 1, "window_seconds": 60}, 400, "INVALID_INPUT", "endpoint_pattern"},
		{"PUT", "/admin/v1/rate-limit-rules/" + id, map[string]any{"endpoint_pattern": ""}, 400, "INVALID_INPUT", "endpoint_pattern"},
		{"POST", "/admin/v1/rate-limit-rules", map[string]any{"tier_id": 77, "endpoint_pattern": "/x", "limit": 1, "window_seconds": 60}, 400, "INVALID_INPUT", "tier_id"},
		{"POST", "/admin/v1/rate-limit-rules", map[string]any{"endpoint_pattern": "/x", "window_seconds": 60}, 400, "INVALID_INPUT", "limit"},
		{"POST", "/admin/v1/rate-limit-rules", map[string]any{"endpoint_pattern": "/x", "limit": 1, "window_seconds": 7200}, 400, "INVALID_LIMIT", "window_seconds"},
		{"POST", "/admin/v1/rate-limit-rules", map[string]any{"endpoint_pattern": "/x", "limit": 1, "window_seconds": 60, "colour": "red"}, 400, "INVALID_INPUT", "colour"},
		{"PUT", "/admin/v1/rate-limit-rules/" + id, map[string]any{"limit": -1}, 400, "INVALID_LIMIT", "limit"},
	} {
		before, _ := s.rdb.Get(context.Background(), keys.AdminVersion).Int64()
		r := s.admin(tt.method, tt.path, tt.body)
		if r.status != tt.status || r.errorCode(t) != tt.code {
			t.Errorf("%s %s %v: %d %s; want %d %s", tt.method, tt.path, tt.body, r.status, r.body, tt.status, tt.code)
			continue
		}
		if f, _ := r.json(t)["error"].(map[string]any)["details"].(map[string]any)["field"].(string); tt.field != "" && f != tt.field {
			t.Errorf("%s %s %v: names field %q, want %q", tt.method, tt.path, tt.body, f, tt.field)
		}
		if after, _ := s.rdb.Get(context.Background(), keys.AdminVersion).Int64(); after != before {
			t.Errorf("%s %s %v was refused but changed the shared state", tt.method, tt.path, tt.body)
		}
	}
	if got := s.admin("GET", "/admin/v1/rate-limit-rules/"+id, nil).json(t); got["limit"] != 75.0 {
		t.Fatalf("a refused update changed the rule: %v", got)
	}
	if d := s.admin("DELETE", "/admin/v1/rate-limit-rules/"+id, nil); d.status != 204 || len(d.body) != 0 {
		t.Fatalf("delete: %d %q", d.status, d.body)
	}
	if g := s.admin("GET", "/admin/v1/rate-limit-rules/"+id, nil); g.status != 404 {
		t.Fatalf("get after delete: %d", g.status)
	}
	if l := s.admin("GET", "/admin/v1/rate-limit-rules/login", nil).json(t); l["read_only"] != true || l["rule_id"] != "login" {
		t.Fatalf("file rule: %v", l)
	}
}

// Tiers have numbers; a runtime tier decides at once; the file's are
// read-only; an endpoint limit above its tier is refused.
func TestTierAPI(t *testing.T) {
	s := startService(t, "", nil)
	list := s.admin("GET", "/admin/v1/tiers", nil).json(t)
	tiers, _ := list["tiers"].([]any)
	if len(tiers) != 2 || tiers[0].(map[string]any)["tier_id"] != 1.0 || tiers[0].(map[string]any)["read_only"] != true {
		t.Fatalf("tiers: %v", list)
	}
	put := s.admin("PUT", "/admin/v1/tiers/3", map[string]any{"name": "gold", "limit": 2, "window_seconds": 60, "endpoints": map[string]int64{"/api/v1/search": 1}})
	if put.status != 200 || put.json(t)["name"] != "gold" {
		t.Fatalf("put tier: %d %s", put.status, put.body)
	}
	req := map[string]any{"user_id": "golden", "endpoint": "/api/v1/items", "tier": "gold"}
	if a, b, c := s.check(req).status, s.check(req).status, s.check(req).status; a != 200 || b != 200 || c != 429 {
		t.Fatalf("gold tier (2 per minute): %d %d %d", a, b, c)
	}
	for _, tt := range []struct {
		path  string
		body  map[string]any
		code  string
		field string
	}{
		{"/admin/v1/tiers/1", map[string]any{"name": "free", "limit": 9, "window_seconds": 60}, "READ_ONLY", ""},
		{"/admin/v1/tiers/4", map[string]any{"name": "Bad Name", "limit": 9, "window_seconds": 60}, "INVALID_INPUT", "name"},
		{"/admin/v1/tiers/4", map[string]any{"name": "big", "limit": 5, "window_seconds": 60, "endpoints": map[string]int64{"/x": 50}}, "INVALID_LIMIT", `endpoints["/x"]`},
		{"/admin/v1/tiers/4", map[string]any{"name": "free", "limit": 5, "window_seconds": 60}, "INVALID_INPUT", "name"},
		{"/admin/v1/tiers/4", map[string]any{"name": "slow", "limit": 5, "window_seconds": 0}, "INVALID_LIMIT", "window_seconds"},
		{"/admin/v1/tiers/4", map[string]any{"name": "odd", "limit": 5, "window_seconds": 60, "algorithm": "leaky"}, "INVALID_STRATEGY", "algorithm"},
		{"/admin/v1/tiers/4", map[string]any{"name": "low", "limit": 5, "window_seconds": 60, "total_limit": 4}, "INVALID_LIMIT", "total_limit"},
		{"/admin/v1/tiers/4", map[string]any{"name": "bidi", "limit": 5, "window_seconds": 60, "description": "Gold \u202etier"}, "INVALID_INPUT", "description"},
		{"/admin/v1/tiers/4", map[string]any{"name": "zw", "limit": 5, "window_seconds": 60, "description": "Go\u200bld"}, "INVALID_INPUT", "description"},
		{"/admin/v1/tiers/zero", map[string]any{"name": "x", "limit": 5, "window_seconds": 60}, "INVALID_INPUT", "tier_id"},
	} {
		r := s.admin("PUT", tt.path, tt.body)
		if r.errorCode(t) != tt.code {
			t.Errorf("PUT %s %v: %d %s; want %s", tt.path, tt.body, r.status, r.body, tt.code)
			continue
		}
		if f, _ := r.json(t)["error"].(map[string]any)["details"].(map[string]any)["field"].(string); tt.field != "" && f != tt.field {
			t.Errorf("PUT %s %v: names field %q, want %q", tt.path, tt.body, f, tt.field)
		}
	}
}

// Every admin route refuses a missing and a wrong token, and does nothing.
func TestEveryAdminRouteNeedsTheToken(t *testing.T) {
	s := startService(t, "", nil)
	routes := []struct{ method, path string }{
		{"POST", "/v1/rate-limit/reset"}, {"PUT", "/v1/rate-limit/config"},
		{"POST", "/admin/v1/api-keys"}, {"GET", "/admin/v1/api-keys"}, {"GET", "/admin/v1/api-keys/k_1"}, {"POST", "/admin/v1/api-keys/k_1/revoke"},
		{"GET", "/admin/v1/rules"},
		{"POST", "/admin/v1/rate-limit-rules"}, {"GET", "/admin/v1/rate-limit-rules"}, {"GET", "/admin/v1/rate-limit-rules/1"},
		{"PUT", "/admin/v1/rate-limit-rules/1"}, {"DELETE", "/admin/v1/rate-limit-rules/1"},
		{"GET", "/admin/v1/tiers"}, {"PUT", "/admin/v1/tiers/3"},
	}
	body := map[string]any{"endpoint_pattern": "/x", "limit": 1, "window_seconds": 60, "name": "x", "user_id": "u", "endpoint": "/x"}
	for _, rt := range routes {
		for _, auth := range []string{"", "Bearer wrong-" + adminToken} {
			r := s.do(rt.method, rt.path, body, "Authorization", auth)
			if r.status != 401 || r.errorCode(t) != "UNAUTHORIZED" {
				t.Errorf("%s %s with %q: %d %s", rt.method, rt.path, auth, r.status, r.body)
			}
		}
	}
	if n := s.dbsize(); n != 0 {
		t.Fatalf("refused admin requests wrote %d keys", n)
	}
}

// A change whose announcement a replica missed reaches it at its version
// check.
func TestMissedAnnouncementIsCaughtByTheVersionCheck(t *testing.T) {
	r := redistest.Start(t)
	s := startServiceOn(t, r, "redis://"+r.Addr+"/0", "", map[string]string{"TOLLGATE_OVERRIDE_REFRESH_MS": "100"})
	ctx := context.Background()
	// A tier written straight into the store, with no announcement.
	s.rdb.HSet(ctx, keys.AdminTiers, "9", `{"tier_id":9,"name":"quiet","limit":1,"window_seconds":60}`)
	s.rdb.Incr(ctx, keys.AdminVersion)
	awaitVersion(t, s)
	req := map[string]any{"user_id": "q", "endpoint": "/x", "tier": "quiet"}
	if a, b := s.check(req).status, s.check(req).status; a != 200 || b != 429 {
		t.Fatalf("tier from the version check: %d %d", a, b)
	}
}

// A key revoked through one replica is refused by the others at once: keys
// are read from Redis on each check, never cached by a replica.
func TestKeyRevokedOnOneReplicaIsRefusedByAll(t *testing.T) {
	rs := replicas(t, 2, "")
	a, b := rs[0], rs[1]
	raw := a.admin("POST", "/admin/v1/api-keys", map[string]any{"user_id": "shared"}).json(t)["api_key"].(string)
	check := map[string]any{"user_id": "ip:192.0.2.5", "endpoint": "/x", "api_key": raw}
	if r := b.check(check); r.status != 200 {
		t.Fatalf("key on b before the revocation: %d %s", r.status, r.body)
	}
	if r := b.admin("POST", "/admin/v1/api-keys/"+raw+"/revoke", nil); r.status != 200 {
		t.Fatalf("revoke on b: %d %s", r.status, r.body)
	}
	for name, s := range map[string]*service{"a": a, "b": b} {
		if r := s.check(check); r.status != 403 || r.errorCode(t) != "API_KEY_REVOKED" {
			t.Errorf("replica %s after the revocation: %d %s", name, r.status, r.body)
		}
	}
}

// What the admin API may store is bounded: rules in all, endpoints per tier;
// a disabled rule is still listed (with is_active false).
func TestRuntimeBounds(t *testing.T) {
	s := startService(t, "", nil)
	eps := map[string]int64{}
	for i := 0; i < 257; i++ {
		eps[fmt.Sprintf("/e%d", i)] = 1
	}
	if r := s.admin("PUT", "/admin/v1/tiers/5", map[string]any{"name": "wide", "limit": 5, "window_seconds": 60, "endpoints": eps}); r.status != 400 {
		t.Fatalf("257 endpoints: %d %s", r.status, r.body)
	}
	off := s.admin("POST", "/admin/v1/rate-limit-rules", map[string]any{"endpoint_pattern": "/off", "limit": 1, "window_seconds": 60, "is_active": false})
	if off.status != 201 {
		t.Fatalf("disabled rule: %d %s", off.status, off.body)
	}
	list := s.admin("GET", "/admin/v1/rate-limit-rules", nil).json(t)
	if list["total"] != 1.0 || list["rules"].([]any)[0].(map[string]any)["is_active"] != false {
		t.Fatalf("a disabled rule is not listed: %v", list)
	}
	if r := s.admin("POST", "/admin/v1/rate-limit-rules", map[string]any{"endpoint_pattern": "/m", "limit": 1, "window_seconds": 60, "methods": make([]string, 40)}); r.status != 400 {
		t.Fatalf("40 methods: %d %s", r.status, r.body)
	}
}

// Concurrent admin changes on two replicas: each is validated against the
// state it replaces, so no two tiers share a name, no update is lost, and a
// race between creates is never reported as an outage.
func TestConcurrentChangesKeepTheRulesValid(t *testing.T) {
	rs := replicas(t, 2, "")
	const n = 8
	type result struct {
		status int
		body   string
		err    error
	}
	race := func(do func(i int) (*response, error)) []result {
		out := make([]result, n)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				r, err := do(i)
				if err != nil {
					out[i].err = err
					return
				}
				out[i] = result{status: r.status, body: string(r.body)}
			}()
		}
		close(start)
		wg.Wait()
		return out
	}
	asAdmin := []string{"Authorization", "Bearer " + adminToken}

	// One name, eight tier ids: exactly one is stored.
	tiers := race(func(i int) (*response, error) {
		return rs[i%2].tryDo("PUT", fmt.Sprintf("/admin/v1/tiers/%d", 10+i),
			map[string]any{"name": "gold", "limit": 5, "window_seconds": 60}, asAdmin...)
	})
	stored := 0
	for _, r := range tiers {
		switch {
		case r.err != nil:
			t.Fatal(r.err)
		case r.status == 200:
			stored++
		case r.status != 400 || !strings.Contains(r.body, `"field":"name"`):
			t.Errorf("a tier that lost the race: %d %s; want 400 naming the field", r.status, r.body)
		}
	}
	if stored != 1 {
		t.Fatalf("%d tiers named gold were stored; want exactly 1", stored)
	}
	for _, s := range rs {
		awaitVersion(t, s)
		list := s.admin("GET", "/admin/v1/tiers", nil).json(t)
		if got := num(t, list, "total"); got != 3 {
			t.Fatalf("a replica lists %d tiers after the race; want 3: %v", got, list)
		}
	}

	// Eight creates at once: eight rules, each 201.
	creates := race(func(i int) (*response, error) {
		return rs[i%2].tryDo("POST", "/admin/v1/rate-limit-rules",
			map[string]any{"endpoint_pattern": fmt.Sprintf("/api/race/%d", i), "limit": 10, "window_seconds": 60}, asAdmin...)
	})
	var id string
	for _, r := range creates {
		if r.err != nil || r.status != 201 {
			t.Fatalf("concurrent create: %d %s %v", r.status, r.body, r.err)
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(r.body), &m); err != nil {
			t.Fatal(err)
		}
		id = fmt.Sprint(m["rule_id"])
	}

	// Eight partial updates of one rule, each naming another field: none is
	// lost.
	fields := []string{"priority", "limit", "burst", "cost"}
	updates := race(func(i int) (*response, error) {
		if i >= len(fields) {
			return rs[i%2].tryDo("GET", "/admin/v1/rate-limit-rules/"+id, nil, asAdmin...)
		}
		return rs[i%2].tryDo("PUT", "/admin/v1/rate-limit-rules/"+id, map[string]any{fields[i]: 7}, asAdmin...)
	})
	for _, r := range updates {
		if r.err != nil || r.status != 200 {
			t.Fatalf("concurrent update: %d %s %v", r.status, r.body, r.err)
		}
	}
	got := rs[0].admin("GET", "/admin/v1/rate-limit-rules/"+id, nil).json(t)
	for _, f := range fields {
		if num(t, got, f) != 7 {
			t.Errorf("after concurrent updates %s = %v; want 7 (an update was lost): %v", f, got[f], got)
		}
	}
}

// An API key belongs to its tier by id: renaming the tier keeps the key in
// it, and a new tier taking the old name does not inherit the key.
func TestKeyFollowsItsTierByID(t *testing.T) {
	s := startService(t, "", nil)
	if r := s.admin("PUT", "/admin/v1/tiers/3", map[string]any{"name": "gold", "limit": 2, "window_seconds": 60}); r.status != 200 {
		t.Fatalf("put tier: %d %s", r.status, r.body)
	}
	created := s.admin("POST", "/admin/v1/api-keys", map[string]any{"user_id": "u1", "tier_id": 3})
	if created.status != 201 {
		t.Fatalf("create key: %d %s", created.status, created.body)
	}
	raw, keyID := created.json(t)["api_key"].(string), created.json(t)["key_id"].(string)
	if r := s.admin("PUT", "/admin/v1/tiers/3", map[string]any{"name": "platinum", "limit": 2, "window_seconds": 60}); r.status != 200 {
		t.Fatalf("rename tier: %d %s", r.status, r.body)
	}
	if r := s.admin("PUT", "/admin/v1/tiers/4", map[string]any{"name": "gold", "limit": 100, "window_seconds": 60}); r.status != 200 {
		t.Fatalf("new tier with the old name: %d %s", r.status, r.body)
	}
	check := func() *response {
		return s.check(map[string]any{"user_id": "ip:192.0.2.1", "endpoint": "/api/v1/items", "api_key": raw})
	}
	first := check().json(t)
	if first["tier"] != "platinum" || first["limit"] != 2.0 {
		t.Fatalf("the key's check after the rename: %v; want tier platinum, limit 2", first)
	}
	if second, third := check(), check(); second.status != 200 || third.status != 429 {
		t.Fatalf("the renamed tier's limit of 2: %d then %d", second.status, third.status)
	}
	view := s.admin("GET", "/admin/v1/api-keys/"+keyID, nil).json(t)
	if view["tier_id"] != 3.0 || view["tier_name"] != "platinum" {
		t.Fatalf("key view after the rename: %v", view)
	}
}

// Entries stored by an earlier version, before today's bounds (a method
// listed twice, a priority or limit beyond the bounds, a description with a
// line break), are read within the bounds: they neither take every runtime
// rule down at start nor make every later change fail validation.
func TestEntriesStoredBeforeTheBoundsAreUpgraded(t *testing.T) {
	r := redistest.Start(t)
	for _, kv := range [][3]string{
		{keys.AdminRules, "7", `{"id":"7","methods":["GET","GET"],"path":"/api/v1/legacy","scope":"identity","algorithm":"fixed_window","limit":1,"window_seconds":60,"priority":5000000}`},
		{keys.AdminTiers, "9", `{"tier_id":9,"name":"legacy","limit":1152921504606846976,"window_seconds":60,"description":"old\r\ntier ` + strings.Repeat("d", 300) + `"}`},
	} {
		if _, err := redistest.Do(r.Addr, "HSET", kv[0], kv[1], kv[2]); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := redistest.Do(r.Addr, "SET", keys.AdminVersion, "1"); err != nil {
		t.Fatal(err)
	}
	s := startServiceOn(t, r, "redis://"+r.Addr+"/0", "", nil)
	req := map[string]any{"user_id": "old", "endpoint": "/api/v1/legacy", "method": "GET"}
	if a, b := s.check(req), s.check(req); a.status != 200 || b.status != 429 || b.json(t)["rule_id"] != "7" {
		t.Fatalf("the stored rule at start: %d then %d %s", a.status, b.status, b.body)
	}
	if p := s.admin("PUT", "/admin/v1/tiers/10", map[string]any{"name": "fresh", "limit": 5, "window_seconds": 60}); p.status != 200 {
		t.Fatalf("a change beside the old entries: %d %s", p.status, p.body)
	}
	rule := s.admin("GET", "/admin/v1/rate-limit-rules/7", nil).json(t)
	if fmt.Sprint(rule["methods"]) != "[GET]" || rule["priority"] != float64(1_000_000) {
		t.Fatalf("rule read back: %v", rule)
	}
	var tiers struct {
		Tiers []struct {
			ID          int    `json:"tier_id"`
			Limit       int64  `json:"limit"`
			Description string `json:"description"`
		} `json:"tiers"`
	}
	if err := json.Unmarshal(s.admin("GET", "/admin/v1/tiers", nil).body, &tiers); err != nil {
		t.Fatal(err)
	}
	for _, tr := range tiers.Tiers {
		if tr.ID == 9 && (tr.Limit != 1<<53-1 || len(tr.Description) > 256 || strings.ContainsAny(tr.Description, "\r\n") || !strings.HasPrefix(tr.Description, "old  tier d")) {
			t.Fatalf("tier read back: %+v", tr)
		}
	}
	if !strings.Contains(s.logs.String(), `runtime rule \"7\" was stored before its bounds`) {
		t.Fatalf("the upgrade was not logged:\n%s", s.logs.String())
	}
}

// A stored runtime rule that no longer fits the file (it names a tier the
// file does not have, as after the tier was removed from the file) is left
// out alone: the other runtime rules decide, admin changes beside it go on,
// a change to it must make it fit, and once fixed it decides.
func TestRuntimeEntryThatNoLongerFitsIsLeftOutAlone(t *testing.T) {
	r := redistest.Start(t)
	for _, kv := range [][3]string{
		{keys.AdminRules, "7", `{"id":"7","path":"/api/v1/kept","scope":"identity","algorithm":"fixed_window","limit":1,"window_seconds":60}`},
		{keys.AdminRules, "8", `{"id":"8","tier_id":42,"tiers":["gone"],"path":"/api/v1/orphan","scope":"identity","algorithm":"fixed_window","limit":1,"window_seconds":60}`},
	} {
		if _, err := redistest.Do(r.Addr, "HSET", kv[0], kv[1], kv[2]); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := redistest.Do(r.Addr, "SET", keys.AdminVersion, "1"); err != nil {
		t.Fatal(err)
	}
	s := startServiceOn(t, r, "redis://"+r.Addr+"/0", "", nil)
	kept := map[string]any{"user_id": "u1", "endpoint": "/api/v1/kept", "method": "GET"}
	if a, b := s.check(kept), s.check(kept); a.status != 200 || b.status != 429 || b.json(t)["rule_id"] != "7" {
		t.Fatalf("the rule that fits, at start: %d then %d %s", a.status, b.status, b.body)
	}
	orphan := map[string]any{"user_id": "u1", "endpoint": "/api/v1/orphan", "method": "GET"}
	if a, b := s.check(orphan), s.check(orphan); a.status != 200 || b.status != 200 || b.json(t)["rule_id"] == "8" {
		t.Fatalf("the rule left out decided: %d then %d %s", a.status, b.status, b.body)
	}
	if logs := s.logs.String(); !strings.Contains(logs, "runtime entry left out") || !strings.Contains(logs, `"entry":"rule 8"`) {
		t.Fatalf("the left-out rule was not logged:\n%s", logs)
	}
	if n := metricValue(t, s, "tollgate_runtime_entries_left_out"); n != 1 {
		t.Fatalf("tollgate_runtime_entries_left_out = %v; want 1", n)
	}
	// A change beside it goes on, and decides.
	created := s.admin("POST", "/admin/v1/rate-limit-rules", map[string]any{"endpoint_pattern": "/api/v1/new", "limit": 1, "window_seconds": 60})
	if created.status != 201 {
		t.Fatalf("a rule created beside the left-out one: %d %s", created.status, created.body)
	}
	fresh := map[string]any{"user_id": "u1", "endpoint": "/api/v1/new", "method": "GET"}
	if a, b := s.check(fresh), s.check(fresh); a.status != 200 || b.status != 429 {
		t.Fatalf("the new rule: %d then %d %s", a.status, b.status, b.body)
	}
	// A new entry that would be left out is still refused, naming the field.
	if p := s.admin("PUT", "/admin/v1/tiers/11", map[string]any{"name": "free", "limit": 5, "window_seconds": 60}); p.status != 400 || !strings.Contains(string(p.body), "name") {
		t.Fatalf("a tier named like a file tier: %d %s", p.status, p.body)
	}
	// A change to the left-out rule that leaves it out is refused...
	if p := s.admin("PUT", "/admin/v1/rate-limit-rules/8", map[string]any{"limit": 2}); p.status != 400 {
		t.Fatalf("an update that still does not fit: %d %s", p.status, p.body)
	}
	// ...and one that makes it fit brings it back.
	if p := s.admin("PUT", "/admin/v1/rate-limit-rules/8", map[string]any{"tier_id": 0}); p.status != 200 {
		t.Fatalf("the fix: %d %s", p.status, p.body)
	}
	other := map[string]any{"user_id": "u2", "endpoint": "/api/v1/orphan", "method": "GET"}
	if a, b := s.check(other), s.check(other); a.status != 200 || b.status != 429 || b.json(t)["rule_id"] != "8" {
		t.Fatalf("the fixed rule: %d then %d %s", a.status, b.status, b.body)
	}
	if n := metricValue(t, s, "tollgate_runtime_entries_left_out"); n != 0 {
		t.Fatalf("tollgate_runtime_entries_left_out = %v after the fix; want 0", n)
	}
}

// A runtime tier can require an API key, as a file tier can (the admin API
// refused require_api_key as an unknown field).
func TestRuntimeTierRequiresAKey(t *testing.T) {
	s := startService(t, "", nil)
	if r := s.admin("PUT", "/admin/v1/tiers/3", map[string]any{"name": "partner", "limit": 5, "window_seconds": 60, "require_api_key": true}); r.status != 200 || r.json(t)["require_api_key"] != true {
		t.Fatalf("put tier: %d %s", r.status, r.body)
	}
	if r := s.check(map[string]any{"user_id": "user:p", "endpoint": "/x", "tier": "partner"}); r.status != 401 || r.errorCode(t) != "MISSING_API_KEY" {
		t.Fatalf("a keyless caller of the tier: %d %s", r.status, r.body)
	}
}

// A runtime rule never lifts a limit of the config file: it counts beside
// the file's rule of its scope, and replaces no file tier's limit (attack
// 53: a runtime rule like the file's login limit, of a million, took an
// address's 3 logins a minute away, and a runtime global rule a cap of 5
// on a backend). A runtime tier's limit a runtime rule still replaces.
func TestRuntimeRulesNeverLiftTheFiles(t *testing.T) {
	windowtest.RoomInMinute(t)
	s := startService(t, `[[tiers]]
name = "free"
limit = 4
window_seconds = 60
[[rules]]
id = "login"
path = "/login"
methods = ["POST"]
scope = "ip"
algorithm = "fixed_window"
limit = 3
window_seconds = 60
priority = 100
`, nil)
	for _, body := range []map[string]any{
		{"endpoint_pattern": "/login", "methods": []string{"POST"}, "scope": "ip", "algorithm": "fixed_window", "limit": 1_000_000, "window_seconds": 60, "priority": 100},
		{"endpoint_pattern": "/items", "scope": "identity", "algorithm": "fixed_window", "limit": 1_000_000, "window_seconds": 60, "priority": 100},
	} {
		if r := s.admin("POST", "/admin/v1/rate-limit-rules", body); r.status != 201 {
			t.Fatalf("create rule: %d %s", r.status, r.body)
		}
	}
	awaitVersion(t, s)
	admitted := func(body map[string]any) (n int) {
		for range 10 {
			if m := s.check(body).json(t); m["allowed"] == true {
				n++
			}
		}
		return n
	}
	if n := admitted(map[string]any{"user_id": "ip:192.0.2.7", "endpoint": "/login", "method": "POST", "tier": "free"}); n != 3 {
		t.Errorf("logins from one address: %d admitted of 10, want the file's 3", n)
	}
	if n := admitted(map[string]any{"user_id": "ip:192.0.2.8", "endpoint": "/items", "tier": "free"}); n != 4 {
		t.Errorf("a file tier's caller under a runtime identity rule: %d admitted of 10, want the tier's 4", n)
	}
	if r := s.admin("PUT", "/admin/v1/tiers/7", map[string]any{"name": "gold", "limit": 4, "window_seconds": 60}); r.status != 200 && r.status != 201 {
		t.Fatalf("put tier: %d %s", r.status, r.body)
	}
	awaitVersion(t, s)
	if n := admitted(map[string]any{"user_id": "ip:192.0.2.9", "endpoint": "/items", "tier": "gold"}); n != 10 {
		t.Errorf("a runtime tier's caller under a runtime identity rule of a million: %d admitted of 10", n)
	}
}
