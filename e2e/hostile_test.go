package e2e

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/testkit/redistest"
)

// The upstream is taken to route paths case-insensitively and to route a
// format suffix and trailing dots and spaces to one handler, as many do.
const hostileControlConfig = `
path_case = "insensitive"
path_aliases = "fold"

[exemptions]
ips = ["10.255.0.0/16"]

[[tiers]]
name = "free"
limit = 3
window_seconds = 60
`

// An attacker at the edge (the gateway as shipped: no trusted proxy in
// front) tries every way we know to choose an identity, dodge a counter or
// make the limiter work. Every row asserts the status, who the request was
// counted as, and that no other caller's counters moved.
func TestHostileRequestsThroughTheGateway(t *testing.T) {
	r := redistest.Start(t)
	ctl := startControl(t, r.Addr, hostileControlConfig)
	up := newUpstream(t)
	plugin := `{"control_cluster":"controlsvc","decision_token":"` + decisionToken + `","timeout_ms":2000,"lease":{"request":0},"excluded_paths":["/healthz"]}`
	edge := startGatewayHops(t, ctl, up, plugin, 0)
	// The victim is behind a trusted proxy of its own, so that it has an
	// address other than loopback; its counters exist before the attack.
	victimGW := startGatewayHops(t, ctl, up, plugin, 1)
	if res := get(t, victimGW, "/api/v1/items", "X-Forwarded-For", "203.0.113.77"); res.status != 200 {
		t.Fatalf("victim: %d %s", res.status, res.body)
	}
	if got := up.last(t).Get("X-Tollgate-Identity"); got != "ip:203.0.113.77" {
		t.Fatalf("victim counted as %q", got)
	}
	const attacker = "ip:127.0.0.1"
	// The attacker spends its own limit on the resource first, so that a
	// fresh counter would show as a 200.
	for i := 0; i < 3; i++ {
		if res := get(t, edge, "/api/v1/items"); res.status != 200 {
			t.Fatalf("attacker request %d: %d", i, res.status)
		}
	}
	manyHeaders := []string{}
	for i := 0; i < 120; i++ {
		manyHeaders = append(manyHeaders, fmt.Sprintf("X-Filler-%d", i), "1")
	}
	for _, tc := range []struct {
		name    string
		path    string
		headers []string
		status  int
		// countedAs is the identity the upstream saw (for a 200).
		countedAs string
	}{
		{"forged X-Forwarded-For is ignored", "/api/v1/orders", []string{"X-Forwarded-For", "198.51.100.1"}, 200, attacker},
		{"victim's address in X-Forwarded-For", "/api/v1/orders", []string{"X-Forwarded-For", "203.0.113.77"}, 200, attacker},
		{"exempt range in X-Forwarded-For", "/api/v1/orders", []string{"X-Forwarded-For", "10.255.0.7"}, 200, attacker},
		{"forged X-Real-IP", "/api/v1/orders", []string{"X-Real-Ip", "203.0.113.77"}, 429, ""},
		{"Connection names the filter's headers", "/api/v1/settings", []string{"Connection", "x-tollgate-identity, X-Tollgate-Decision"}, 200, attacker},
		{"WebSocket upgrade", "/api/v1/profile", []string{"Connection", "Upgrade", "Upgrade", "websocket"}, 403, ""},
		{"forged identity headers", "/api/v1/profile", []string{"X-Tollgate-Identity", "ip:203.0.113.77", "X_Tollgate_Decision", "exempt"}, 200, attacker},
		{"two Authorization headers", "/api/v1/profile", []string{"Authorization", "Bearer a.b.c", "Authorization", "Basic YTpi"}, 400, ""},
		{"two API keys", "/api/v1/profile", []string{"X-Api-Key", "tg_a", "X-Api-Key", "tg_b"}, 400, ""},
		{"API key and its underscore spelling", "/api/v1/profile", []string{"X-Api-Key", "tg_a", "X_Api_Key", "tg_b"}, 400, ""},
		{"braces in an API key", "/api/v1/profile", []string{"X-Api-Key", "{ip:203.0.113.77}"}, 400, ""},
		{"10 kB X-Forwarded-For", "/api/v1/profile", []string{"X-Forwarded-For", strings.Repeat("9.9.9.9,", 1250)}, 200, attacker},
		{"escaped letter after the limit", "/api/v1/%69tems", nil, 429, ""},
		{"trailing slash after the limit", "/api/v1/items/", nil, 429, ""},
		{"matrix parameter after the limit", "/api/v1/items;a", nil, 429, ""},
		{"format suffix after the limit", "/api/v1/items.json", nil, 429, ""},
		{"trailing dot after the limit", "/api/v1/items.", nil, 429, ""},
		{"trailing space after the limit", "/api/v1/items%20", nil, 429, ""},
		{"suffix, dot and case after the limit", "/API/v1/Items.XML.", nil, 429, ""},
		{"double slash after the limit", "//api//v1/items", nil, 429, ""},
		{"dot segment: refused (an upstream gets it as sent unless the proxy resolves it)", "/api/./v1/items", nil, 400, ""},
		{"escaped slash: refused (upstreams read it two ways)", "/api%2Fv1%2Fitems", nil, 400, ""},
		{"escaped slash and dot segments: refused", "/api/v1/items/7%2F..%2F..%2Fx", nil, 400, ""},
		{"upper case after the limit", "/API/V1/Items", nil, 429, ""},
		{"upper case escaped after the limit", "/api/v1/%49TEMS", nil, 429, ""},
		{"excluded path reached by dot segments is refused", "/api/v1/items/..;/../../../healthz", nil, 400, ""},
		{"more headers than Envoy accepts", "/api/v1/profile", manyHeaders, 431, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := countersExcept(t, r.Addr, attacker)
			seen := up.count()
			res := get(t, edge, tc.path, tc.headers...)
			if res.status != tc.status {
				t.Fatalf("status %d, want %d: %s", res.status, tc.status, res.body)
			}
			if tc.countedAs != "" {
				if up.count() != seen+1 || up.last(t).Get("X-Tollgate-Identity") != tc.countedAs || up.last(t).Get("X-Tollgate-Decision") != "allowed" {
					t.Fatalf("upstream saw identity %q decision %q", up.last(t).Get("X-Tollgate-Identity"), up.last(t).Get("X-Tollgate-Decision"))
				}
			} else if up.count() != seen {
				t.Fatal("a refused request reached the upstream")
			}
			if after := countersExcept(t, r.Addr, attacker); after != before {
				t.Fatalf("other callers' counters moved:\nbefore %s\nafter  %s", before, after)
			}
		})
	}

	// Paths the normaliser refuses, sent raw (a Go client would not). An
	// escaped control character would be a fresh counter for a spelling that
	// an upstream may cut short ("%00") or strip ("%0A").
	// A raw fragment ('#') is refused as Envoy refuses it: counted with the
	// '#' escaped, it got a counter of its own while the upstream served the
	// path without it (an outsider's attack got 50 logins a minute, not 5).
	for _, path := range []string{"/api/v1/%zzitems", "/api/v1/items%00", "/api/v1/items%0A", "/api/v1/items%0d%0aX-Evil:%201",
		"/api/v1/items#x", "/api/v1/items#"} {
		t.Run("refused path "+path, func(t *testing.T) {
			before := countersExcept(t, r.Addr, attacker)
			seen := up.count()
			if status := rawGet(t, edge, path); status != 400 {
				t.Fatalf("status %d, want 400", status)
			}
			if up.count() != seen {
				t.Fatal("a refused request reached the upstream")
			}
			if after := countersExcept(t, r.Addr, attacker); after != before {
				t.Fatal("other callers' counters moved")
			}
		})
	}
}

// countersExcept lists every rate-limit key outside the given identity's
// hash tag with its serialised value: equal snapshots mean nobody else's
// counters moved.
func countersExcept(t *testing.T, addr, identity string) string {
	t.Helper()
	reply, err := redistest.Do(addr, "KEYS", "rl:{*")
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, k := range reply.([]any) {
		key := k.(string)
		if strings.Contains(key, identity) {
			continue
		}
		v, err := redistest.Do(addr, "DUMP", key)
		if err != nil {
			t.Fatal(err)
		}
		lines = append(lines, fmt.Sprintf("%s=%q", key, v))
	}
	sort.Strings(lines)
	return strings.Join(lines, " ")
}

// rawGet sends a request line as written, which net/http's client refuses to
// do for a malformed path, and returns the status.
func rawGet(t *testing.T, base, path string) int {
	t.Helper()
	conn, err := net.DialTimeout("tcp", strings.TrimPrefix(base, "http://"), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: api\r\nConnection: close\r\n\r\n", path)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// X-Forwarded-For sent as two header lines reaches the filter and the
// upstream as two lines, in order, with the gateway's peer appended to the
// last one as Envoy appends it; behind one trusted proxy the client is the
// entry left of the peer's.
func TestForwardedForLinesThroughTheGateway(t *testing.T) {
	r := redistest.Start(t)
	ctl := startControl(t, r.Addr, hostileControlConfig)
	up := newUpstream(t)
	gw := startGatewayHops(t, ctl, up, `{"control_cluster":"controlsvc","decision_token":"`+decisionToken+`","lease":{"request":0}}`, 1)
	res := get(t, gw, "/api/v1/items", "X-Forwarded-For", "198.51.100.1, 198.51.100.2", "X-Forwarded-For", "203.0.113.9")
	if res.status != 200 {
		t.Fatalf("%d %s", res.status, res.body)
	}
	seen := up.last(t)
	if got := seen.Values("X-Forwarded-For"); len(got) != 2 || got[0] != "198.51.100.1, 198.51.100.2" || got[1] != "203.0.113.9, 127.0.0.1" {
		t.Fatalf("upstream X-Forwarded-For lines %q", got)
	}
	if got := seen.Get("X-Tollgate-Identity"); got != "ip:203.0.113.9" {
		t.Fatalf("counted as %q, want the entry left of the peer's", got)
	}
}
