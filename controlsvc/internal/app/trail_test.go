package app_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
	"testing"

	"github.com/tollgate-rl/tollgate/controlsvc/internal/keys"
	"github.com/tollgate-rl/tollgate/testkit/windowtest"
)

// Usage counts what was admitted (leases the filter will spend included,
// tokens it gave back excluded) and the violations; the audit trail holds
// each admin change with its actor, before and after, and each violation.
func TestUsageAndAudit(t *testing.T) {
	s := startService(t, "[[tiers]]\nname = \"free\"\nlimit = 5\nwindow_seconds = 60\n[[tiers]]\nname = \"premium\"\nlimit = 1000\nwindow_seconds = 60\n",
		map[string]string{"TOLLGATE_ADMIN_TOKEN": "ops:" + adminToken, "TOLLGATE_LEASE_FRACTION": "0.5", "TOLLGATE_LEASE_MAX": "10"})
	created := s.admin("POST", "/admin/v1/api-keys", map[string]any{"user_id": "u1", "tier": "free"})
	raw, keyID := created.json(t)["api_key"].(string), created.json(t)["key_id"].(string)
	// Plain checks, checks taking a lease, checks giving tokens back (up to
	// what is still leased: a claim beyond that gives nothing back), checks
	// reporting lease tokens the filter spent (requests made, counted
	// whether the check itself passes), and denials (violations). Usage
	// counts requests made, never tokens leased.
	var want, denied, leased, gaveBack, overclaimed int64
	for _, extra := range []map[string]any{{"lease": 10}, {"lease": 10}, {"returned": 1}, {"spent": 3}, {"returned": 1}, {"returned": 1}, {"returned": 1}, {"returned": 1, "spent": 2}} {
		body := map[string]any{"user_id": "ip:192.0.2.1", "endpoint": "/x", "api_key": raw}
		for k, v := range extra {
			body[k] = v
		}
		r := s.check(body)
		m := r.json(t)
		returned, _ := extra["returned"].(int)
		credited := min(int64(returned), leased)
		leased -= credited
		gaveBack += credited
		overclaimed += int64(returned) - credited
		spent, _ := extra["spent"].(int)
		want += int64(spent) // reported spent lease tokens are requests made, admitted or not
		switch r.status {
		case 200:
			leased += int64(m["lease"].(map[string]any)["granted"].(float64))
			want++ // a lease granted is no request until its tokens are reported spent
		case 429:
			denied++
		default:
			t.Fatalf("check: %d %s", r.status, r.body)
		}
	}
	if err := s.app.FlushUsage(context.Background()); err != nil {
		t.Fatal(err)
	}
	u := s.admin("GET", "/admin/v1/usage/"+url.PathEscape(raw)+"?window=current", nil)
	m := u.json(t)
	cw, _ := m["current_window"].(map[string]any)
	day, _ := m["last_24_hours"].(map[string]any)
	if gaveBack == 0 || overclaimed == 0 {
		t.Fatalf("returns credited %d, claimed beyond the lease %d: the sequence must do both", gaveBack, overclaimed)
	}
	if u.status != 200 || m["key_id"] != keyID || m["tier"] != "free" || cw == nil || int64(cw["requests_made"].(float64)) != want ||
		int64(day["total_requests"].(float64)) != want || int64(day["violations"].(float64)) != denied || denied == 0 {
		t.Fatalf("usage (want %d requests, %d violations): %d %s", want, denied, u.status, u.body)
	}
	if byID := s.admin("GET", "/admin/v1/usage/"+keyID, nil).json(t); byID["identity"] != "key:"+keyID {
		t.Fatalf("usage by key id: %v", byID)
	}
	for _, who := range []string{"user:%0Abad", "nobody%20here?window=past"} {
		if r := s.admin("GET", "/admin/v1/usage/"+who, nil); r.status != 400 {
			t.Errorf("usage of %q: %d %s", who, r.status, r.body)
		}
	}
	// Admin changes in the trail, with the token holder's name.
	rule := s.admin("POST", "/admin/v1/rate-limit-rules", map[string]any{"endpoint_pattern": "/y", "limit": 3, "window_seconds": 60})
	id := fmt.Sprint(rule.json(t)["rule_id"])
	s.admin("PUT", "/admin/v1/rate-limit-rules/"+id, map[string]any{"limit": 4})
	page := s.admin("GET", "/admin/v1/audit?type=admin", nil)
	var trail struct {
		Events []struct {
			Type, Actor, Action, Target string
			Before, After               json.RawMessage
		} `json:"events"`
	}
	if err := json.Unmarshal(page.body, &trail); err != nil || page.status != 200 {
		t.Fatalf("audit: %d %s", page.status, page.body)
	}
	var sawUpdate, sawKey bool
	for _, e := range trail.Events {
		if e.Type != "admin" || e.Actor != "ops" {
			t.Fatalf("event %+v: want type admin by ops", e)
		}
		if e.Action == "rule.update" && e.Target == id {
			var before, after map[string]any
			json.Unmarshal(e.Before, &before)
			json.Unmarshal(e.After, &after)
			sawUpdate = before["limit"] == 3.0 && after["limit"] == 4.0
		}
		if e.Action == "api_key.create" {
			sawKey = true
			if strings.Contains(string(e.After), raw) || strings.Contains(string(e.After), raw[len("ak_live_"):]) {
				t.Fatal("the raw key reached the audit trail")
			}
		}
	}
	if !sawUpdate || !sawKey {
		t.Fatalf("trail lacks the rule update's before/after or the key creation: %s", page.body)
	}
	v := s.admin("GET", "/admin/v1/audit?type=violation&limit=2", nil).json(t)
	if v["count"] != 2.0 || v["next"] == nil {
		t.Fatalf("violations page: %v", v)
	}
	if rest := s.admin("GET", "/admin/v1/audit?type=violation&since="+v["next"].(string), nil).json(t); rest["count"] != float64(denied-2) {
		t.Fatalf("next page of violations: %v", rest)
	}
	for _, q := range []string{"?type=other", "?limit=0", "?since=yesterday"} {
		if r := s.admin("GET", "/admin/v1/audit"+q, nil); r.status != 400 {
			t.Errorf("audit%s: %d", q, r.status)
		}
	}
}

// Overrides can be listed and deleted, and the deletion is audited.
func TestOverridesListAndDelete(t *testing.T) {
	windowtest.RoomInMinute(t)
	s := startService(t, "", nil)
	put := map[string]any{"user_id": "user_9", "endpoint": "/api/v1/users", "limit": 2, "window_seconds": 60, "strategy": "fixed_window"}
	if r := s.admin("PUT", "/v1/rate-limit/config", put); r.status != 200 {
		t.Fatalf("put: %d %s", r.status, r.body)
	}
	list := s.admin("GET", "/admin/v1/overrides", nil).json(t)
	all, _ := list["overrides"].([]any)
	if len(all) != 1 || all[0].(map[string]any)["identity"] != "user:user_9" || all[0].(map[string]any)["endpoint"] != "/api/v1/users" {
		t.Fatalf("overrides: %v", list)
	}
	if r := s.admin("DELETE", "/v1/rate-limit/config", map[string]any{"user_id": "user_9", "endpoint": "/api/v1/users"}); r.status != 204 {
		t.Fatalf("delete: %d %s", r.status, r.body)
	}
	if r := s.admin("DELETE", "/v1/rate-limit/config", map[string]any{"user_id": "user_9", "endpoint": "/api/v1/users"}); r.status != 404 {
		t.Fatalf("delete again: %d %s", r.status, r.body)
	}
	req := map[string]any{"user_id": "user_9", "endpoint": "/api/v1/users"}
	if a, b, c := s.check(req).status, s.check(req).status, s.check(req).status; a != 200 || b != 200 || c != 200 {
		t.Fatalf("the deleted override still decides: %d %d %d", a, b, c)
	}
}

// Violations are made by clients, so they are kept apart from admin
// changes: however many denials a client provokes, no admin change is
// trimmed for them. The trail without a type merges both, in order, and
// pages through them.
func TestViolationsNeverCrowdOutAdminChanges(t *testing.T) {
	s := startService(t, "[[tiers]]\nname = \"free\"\nlimit = 1\nwindow_seconds = 60\n", nil)
	s.admin("POST", "/admin/v1/rate-limit-rules", map[string]any{"endpoint_pattern": "/first", "limit": 3, "window_seconds": 60})
	const denials = 7
	for i := range denials + 1 {
		// A new method each time: a client dodging the filter's cached denial.
		if r := s.check(map[string]any{"user_id": "ip:192.0.2.9", "endpoint": "/x", "method": "M" + strings.Repeat("X", i)}); r.status != 200 && r.status != 429 {
			t.Fatalf("check %d: %d %s", i, r.status, r.body)
		}
	}
	if err := s.app.FlushUsage(context.Background()); err != nil {
		t.Fatal(err)
	}
	s.admin("POST", "/admin/v1/rate-limit-rules", map[string]any{"endpoint_pattern": "/second", "limit": 3, "window_seconds": 60})
	ctx := context.Background()
	if n, err := s.rdb.XLen(ctx, keys.Audit).Result(); err != nil || n != 2 {
		t.Fatalf("admin stream holds %d entries (%v); want the 2 changes, no violations", n, err)
	}
	if n, err := s.rdb.XLen(ctx, keys.AuditViolations).Result(); err != nil || n != denials {
		t.Fatalf("violation stream holds %d entries (%v); want %d", n, err, denials)
	}
	var types []string
	var last, since string
	for page := 0; page < 10; page++ {
		q := "?limit=3"
		if since != "" {
			q += "&since=" + since
		}
		r := s.admin("GET", "/admin/v1/audit"+q, nil)
		var body struct {
			Events []struct{ ID, Type string } `json:"events"`
			Next   *string                     `json:"next"`
		}
		if err := json.Unmarshal(r.body, &body); err != nil || r.status != 200 {
			t.Fatalf("audit page: %d %s", r.status, r.body)
		}
		for _, e := range body.Events {
			// Each stream numbers its own events, so an admin change and
			// a violation in one millisecond may share an id; never two of
			// one stream.
			sameID := last == e.ID && types[len(types)-1] != e.Type
			if last != "" && !idBefore(last, e.ID) && !sameID {
				t.Fatalf("event %s after %s: the merged trail is out of order", e.ID, last)
			}
			last = e.ID
			types = append(types, e.Type)
		}
		if body.Next == nil || *body.Next == "" {
			break
		}
		since = *body.Next
	}
	// The ids above are in order; which of two events sharing an id comes
	// first is not (a run once saw the second change share the millisecond of
	// the flushed violations), so count, do not place.
	if admins := strings.Count(strings.Join(types, " "), "admin"); len(types) != denials+2 || admins != 2 {
		t.Fatalf("merged trail: %v; want 2 admin changes and %d violations", types, denials)
	}
}

// idBefore orders two stream ids.
func idBefore(a, b string) bool {
	var ams, aseq, bms, bseq uint64
	fmt.Sscanf(a, "%d-%d", &ams, &aseq)
	fmt.Sscanf(b, "%d-%d", &bms, &bseq)
	return ams < bms || ams == bms && aseq < bseq
}

// Usage of a key named by its identity (key:k_…) reads the key's tier, as
// by its id or its raw value (it read the default tier).
func TestUsageOfAKeyIdentityUsesItsTier(t *testing.T) {
	s := startService(t, "", nil)
	id := s.admin("POST", "/admin/v1/api-keys", map[string]any{"user_id": "u9", "tier": "premium"}).json(t)["key_id"].(string)
	for _, who := range []string{id, "key:" + id} {
		if u := s.admin("GET", "/admin/v1/usage/"+url.PathEscape(who)+"?window=current", nil); u.status != 200 || u.json(t)["tier"] != "premium" {
			t.Errorf("usage of %s: %d %s", who, u.status, u.body)
		}
	}
}
