package e2e

import (
	"fmt"
	"github.com/tollgate-rl/tollgate/filter/devhost/gateway"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/testkit/redistest"
)

// The two ways around the tier an outsider found, through the compiled
// filter with leases on: a ceiling rule of another scope on every path
// used to lift the tier (30 of 30 through a 5-per-path tier), and walking
// distinct paths of a per-endpoint tier was never limited. Now the tier
// holds beside the ceiling, and the tier's total stops the walk. Leases
// over several rules never admit beyond a counter (the upstream's count
// is the admissions').
func TestTierCannotBeWalkedAroundThroughTheGateway(t *testing.T) {
	r := redistest.Start(t)
	ctl := startControl(t, r.Addr, `
[lease]
fraction = 0.5
max = 10
ttl_ms = 60000

[[tiers]]
name = "free"
limit = 5
window_seconds = 3600
algorithm = "fixed_window"
total_limit = 20

[[rules]]
id = "ceiling"
path = "/**"
scope = "ip"
algorithm = "fixed_window"
limit = 1000
window_seconds = 3600
`)
	up := newUpstream(t)
	gw := startGateway(t, ctl, up, `{"control_cluster":"controlsvc","decision_token":"`+decisionToken+`","timeout_ms":2000,"lease":{"request":10}}`)
	admitted := func(address string, paths func(i int) string, n int) int {
		ok := 0
		for i := 0; i < n; i++ {
			res := get(t, gw, paths(i), "X-Forwarded-For", address)
			switch res.status {
			case 200:
				ok++
			case 429:
			default:
				t.Fatalf("%s: %d %s", paths(i), res.status, res.body)
			}
		}
		return ok
	}
	before := up.count()
	if got := admitted("203.0.113.10", func(int) string { return "/api/v1/items" }, 30); got > 5 || got < 4 {
		t.Errorf("one path under a 1,000 ceiling: %d of 30 admitted; the tier allows 5", got)
	}
	if got := admitted("203.0.113.11", func(i int) string { return fmt.Sprintf("/api/v1/items/%d", i) }, 60); got > 20 || got < 16 {
		t.Errorf("60 distinct paths: %d admitted; the tier's total is 20", got)
	}
	if n := up.count() - before; n > 25 {
		t.Errorf("the upstream saw %d requests; at most 25 were admitted", n)
	}
}

// deletesConfig is a generous tier under a DELETE-only rule of 2 an
// hour: the method-override tests show a disguised DELETE spends it.
const deletesConfig = `
[[tiers]]
name = "free"
limit = 1000
window_seconds = 3600

[[rules]]
id = "deletes"
path = "/api/v1/items"
methods = ["DELETE"]
scope = "ip"
algorithm = "fixed_window"
limit = 2
window_seconds = 3600
`

// A DELETE-only limit cannot be walked around with ?_method=DELETE on a
// POST (which Laravel, Symfony and Express's method-override route as a
// DELETE): counted, the override spends the DELETE rule; stripped, the
// upstream never sees it (found by an outsider's attack: 6 of 6 admitted
// past a limit of 2).
func TestMethodOverrideInTheQueryThroughTheGateway(t *testing.T) {
	r := redistest.Start(t)
	ctl := startControl(t, r.Addr, deletesConfig)
	up := newUpstream(t)
	post := func(gw, path, address string) int {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, gw+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-Forwarded-For", address)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	config := func(mode string) string {
		return `{"control_cluster":"controlsvc","decision_token":"` + decisionToken + `","timeout_ms":2000,"lease":{"request":0},"method_override":"` + mode + `"}`
	}
	counted := startGateway(t, ctl, up, config("count"))
	var got []int
	for _, path := range []string{"/api/v1/items?_method=DELETE", "/api/v1/items?a=1&%5Fmethod=delete", "/api/v1/items?_method=DELETE", "/api/v1/items"} {
		got = append(got, post(counted, path, "203.0.113.20"))
	}
	if fmt.Sprint(got) != "[200 200 429 200]" {
		t.Errorf("POSTs with ?_method=DELETE, then a plain POST: %v; want [200 200 429 200] (two DELETEs allowed)", got)
	}
	stripped := startGateway(t, ctl, up, config("strip"))
	if st := post(stripped, "/api/v1/items?a=1&_method=DELETE&b=2", "203.0.113.21"); st != 200 {
		t.Fatalf("stripped: %d", st)
	}
	if h := up.last(t); h.Get("X-Test-URI") != "/api/v1/items?a=1&b=2" || h.Get("X-Test-Method") != "POST" {
		t.Errorf("the upstream got %s %s; want POST /api/v1/items?a=1&b=2", h.Get("X-Test-Method"), h.Get("X-Test-URI"))
	}
	// The rest of the query reaches the upstream as sent, as through Envoy
	// (Go's ReverseProxy would drop a parameter with a ';' and re-escape a
	// bad '%' escape: the upstream would not see what the filter saw).
	for _, tc := range []struct{ path, upstream string }{
		{"/api/v1/items?a=1;b=2&_method=DELETE", "/api/v1/items?a=1;b=2"},
		{"/api/v1/items?q=%zz&_method=DELETE", "/api/v1/items?q=%zz"},
		{"/api/v1/items?x=;y", "/api/v1/items?x=;y"},
	} {
		if st := post(stripped, tc.path, "203.0.113.22"); st != 200 {
			t.Fatalf("%s: %d", tc.path, st)
		}
		if got := up.last(t).Get("X-Test-URI"); got != tc.upstream {
			t.Errorf("%s: the upstream got %s, want %s", tc.path, got, tc.upstream)
		}
	}
}

// Nor with a _method field in a form body, which Rails, Laravel and
// Symfony read on a POST: the body goes on through the filter, its end
// held while the DELETE rule is asked; refused, the client gets 429 and
// the upstream request is given up. Urlencoded and multipart alike; a
// plain POST is no DELETE.
func TestMethodOverrideInTheFormBodyThroughTheGateway(t *testing.T) {
	r := redistest.Start(t)
	ctl := startControl(t, r.Addr, deletesConfig)
	up := newUpstream(t)
	gw := startGateway(t, ctl, up, `{"control_cluster":"controlsvc","decision_token":"`+decisionToken+`","timeout_ms":2000,"lease":{"request":0}}`)
	const multipart = "--b\r\nContent-Disposition: form-data; name=\"_method\"\r\n\r\ndelete\r\n--b--\r\n"
	sent := map[string]bool{}
	post := func(contentType, body string) int {
		t.Helper()
		sent[body] = true
		req, err := http.NewRequest(http.MethodPost, gw+"/api/v1/items", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", contentType)
		req.Header.Set("X-Forwarded-For", "203.0.113.30")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	const form = "application/x-www-form-urlencoded"
	before := up.count()
	got := []int{
		post(form, "a=1&_method=DELETE"),
		post("multipart/form-data; boundary=b", multipart),
		post(form, "_method=DELETE&b=2"),
		post("multipart/form-data; boundary=b", multipart),
		post(form, "a=1"),
	}
	// A form body past the proxy's buffer limit (Envoy's default 1 MiB)
	// is not held whole, so not read: 413, as from Envoy.
	got = append(got, post(form, "_method=DELETE&x="+strings.Repeat("a", 1<<20)))
	if fmt.Sprint(got) != "[200 200 429 429 200 413]" {
		t.Errorf("form POSTs naming DELETE, then a plain POST, then a large one: %v; want [200 200 429 429 200 413] (two DELETEs allowed)", got)
	}
	// The body is held whole until it is decided: a refused request's
	// upstream gets its headers and none of it (an upstream that acts on a
	// prefix when reset, as Django's development server does, routed one
	// as DELETE).
	whole := 0
	for _, h := range up.since(before) {
		switch b := h.Get("X-Test-Body"); {
		case b == "":
		case sent[b]:
			whole++
		default:
			t.Errorf("the upstream read part of a body: %.40q", b)
		}
	}
	if whole != 3 {
		t.Errorf("the upstream read %d whole bodies, want 3 (the admitted requests')", whole)
	}
}

// Form POSTs are held whole while the filter reads them, and the gateway
// bounds what it holds at once (HeldBodies), as Envoy's overload manager
// would: past it a request is answered 503, and what a request held is
// counted out when it ends (an outsider's 1,000 slow form POSTs held 2 GB).
func TestHeldFormBodiesAreBounded(t *testing.T) {
	r := redistest.Start(t)
	ctl := startControl(t, r.Addr, deletesConfig)
	up := newUpstream(t)
	upURL, _ := url.Parse(up.URL)
	ctlURL, _ := url.Parse("http://" + ctl.addr)
	gw, g := serveGatewayOf(t, gateway.Config{
		Wasm: wasmBytes, PluginConfig: []byte(`{"control_cluster":"controlsvc","decision_token":"` + decisionToken + `","timeout_ms":2000,"lease":{"request":0}}`),
		Upstream: upURL, Clusters: map[string]*url.URL{"controlsvc": ctlURL}, VMs: 1, CompilationCache: compCache, XFFTrustedHops: 1,
		HeldBodies: 100 << 10,
	})
	post := func(body io.Reader) (*http.Response, error) {
		req, _ := http.NewRequest(http.MethodPost, gw+"/api/v1/items", body)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("X-Forwarded-For", "203.0.113.40")
		return http.DefaultClient.Do(req)
	}
	// A slow form: 80 KiB, then nothing until released.
	pr, pw := io.Pipe()
	slow := make(chan int, 1)
	go func() {
		resp, err := post(pr)
		if err != nil {
			slow <- 0
			return
		}
		resp.Body.Close()
		slow <- resp.StatusCode
	}()
	if _, err := pw.Write([]byte("a=" + strings.Repeat("x", 80<<10))); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for g.HeldBodyBytes() < 80<<10 {
		if time.Now().After(deadline) {
			t.Fatalf("the gateway holds %d bytes of the slow form", g.HeldBodyBytes())
		}
		time.Sleep(time.Millisecond)
	}
	resp, err := post(strings.NewReader("b=" + strings.Repeat("y", 40<<10)))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("a second form past the bound: %d, want 503", resp.StatusCode)
	}
	pw.Close()
	if code := <-slow; code != 200 {
		t.Errorf("the slow form, finished: %d, want 200", code)
	}
	for g.HeldBodyBytes() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d bytes still counted held after both ended", g.HeldBodyBytes())
		}
		time.Sleep(time.Millisecond)
	}
}
