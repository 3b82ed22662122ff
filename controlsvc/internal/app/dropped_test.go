package app_test

import (
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"
)

// An operator's change is carried out whole, audit entry included, when
// the client goes away before the answer: on the request's context, a
// change whose client reset its connection just after sending it was
// stored and then its audit entry cancelled (attack 53: 107 rules created
// and 90 overrides set with no trace in the trail), or answered 503 though
// stored. Clients here send a rule and reset at once (SO_LINGER 0), at
// spread moments; every rule stored must have its rule.create entry.
func TestDroppedAdminChangesAreAudited(t *testing.T) {
	s := startService(t, "", map[string]string{"TOLLGATE_ADMIN_TOKEN": "ops:" + adminToken})
	addr := strings.TrimPrefix(s.base, "http://")
	const n = 120
	for i := range n {
		body := fmt.Sprintf(`{"endpoint_pattern":"/dropped/%d","scope":"ip","algorithm":"fixed_window","limit":5,"window_seconds":60}`, i)
		req := "POST /admin/v1/rate-limit-rules HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer " + adminToken +
			"\r\nContent-Type: application/json\r\nContent-Length: " + fmt.Sprint(len(body)) + "\r\n\r\n" + body
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write([]byte(req)); err != nil {
			t.Fatal(err)
		}
		// Reset after 0 to 600 µs: some before the store write, some
		// during it, some after.
		time.Sleep(time.Duration(i%7) * 100 * time.Microsecond)
		c.(*net.TCPConn).SetLinger(0)
		c.Close()
	}
	stored := func() map[string]bool {
		var list struct {
			Rules []struct {
				EndpointPattern string `json:"endpoint_pattern"`
			} `json:"rules"`
		}
		if err := json.Unmarshal(s.admin("GET", "/admin/v1/rate-limit-rules", nil).body, &list); err != nil {
			t.Fatal(err)
		}
		out := map[string]bool{}
		for _, r := range list.Rules {
			out[r.EndpointPattern] = true
		}
		return out
	}
	audited := func() map[string]bool {
		var page struct {
			Events []struct {
				Action string          `json:"action"`
				After  json.RawMessage `json:"after"`
			} `json:"events"`
		}
		if err := json.Unmarshal(s.admin("GET", "/admin/v1/audit?type=admin&limit=1000", nil).body, &page); err != nil {
			t.Fatal(err)
		}
		out := map[string]bool{}
		for _, e := range page.Events {
			var after struct {
				EndpointPattern string `json:"endpoint_pattern"`
			}
			if e.Action == "rule.create" && json.Unmarshal(e.After, &after) == nil {
				out[after.EndpointPattern] = true
			}
		}
		return out
	}
	// The changes still running finish within the Redis timeouts. A poll
	// reads the rules before the trail, so a rule stored between the two
	// reads can be audited in the second while one the first read is not
	// yet: the wait is for every rule read to be audited, two polls alike,
	// not for the two counts to match.
	allAudited := func(st, au map[string]bool) bool {
		for p := range st {
			if !au[p] {
				return false
			}
		}
		return len(st) > 0 && len(au) == len(st)
	}
	var st, au map[string]bool
	for deadline, prev := time.Now().Add(10*time.Second), 0; ; time.Sleep(20 * time.Millisecond) {
		st, au = stored(), audited()
		if allAudited(st, au) && len(st) == prev || time.Now().After(deadline) {
			break
		}
		prev = len(st)
	}
	t.Logf("%d of %d dropped rule creations stored, %d audited", len(st), n, len(au))
	if len(st) == 0 {
		t.Fatal("no dropped change was stored: the test reset every request before the service read it")
	}
	for p := range st {
		if !au[p] {
			t.Errorf("rule %s stored with no audit entry", p)
		}
	}
	if strings.Contains(s.logs.String(), "audit trail not written") {
		t.Error("the log says an audit entry was not written")
	}
}

// No cache keeps an operator's answers: the one to a new API key carries
// the raw key (attack 53, defence in depth: shared caches do not store
// answers to requests with Authorization by default).
func TestAdminAnswersAreNotStored(t *testing.T) {
	s := startService(t, "", nil)
	for _, r := range []*response{
		s.admin("POST", "/admin/v1/api-keys", map[string]any{"user_id": "u1"}),
		s.admin("GET", "/admin/v1/api-keys", nil),
		s.admin("GET", "/admin/v1/audit", nil),
	} {
		if got := r.header.Get("Cache-Control"); got != "no-store" {
			t.Errorf("status %d: Cache-Control %q, want no-store", r.status, got)
		}
	}
}
