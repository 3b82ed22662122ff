// Package e2e runs the whole product over real HTTP on loopback: a real
// redis-server, the controlsvc binary as its own process, the gateway running
// the compiled filter, and an upstream that records what reached it.
package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tetratelabs/wazero"
	"go.uber.org/goleak"

	"github.com/tollgate-rl/tollgate/filter/devhost/gateway"
	"github.com/tollgate-rl/tollgate/testkit/redistest"
)

var (
	controlBin string
	wasmBytes  []byte
	// compiled once for every gateway of the run
	compCache = wazero.NewCompilationCache()
)

// Service credentials, as long as the service requires them to be.
const (
	adminToken    = "e2e-admin-token-4f1c9a7b2e6d8c0a5b3f"
	decisionToken = "e2e-decision-token-9d2b7e4a1c6f3b8d0e5a"
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "tollgate-e2e")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	controlBin = filepath.Join(dir, "controlsvc")
	wasm := filepath.Join(dir, "tollgate.wasm")
	steps := []*exec.Cmd{
		exec.Command("go", "build", "-o", controlBin, "../controlsvc/cmd/controlsvc"),
		exec.Command("go", "build", "-buildmode=c-shared", "-o", wasm, "."),
	}
	steps[1].Dir = "../filter"
	steps[1].Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
	for _, c := range steps {
		c.Stdout, c.Stderr = os.Stderr, os.Stderr
		if err := c.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "build:", c.Args, err)
			os.Exit(1)
		}
	}
	if wasmBytes, err = os.ReadFile(wasm); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	// Every gateway a test starts (its VMs, servers and callouts) stops
	// with it: no goroutine outlives the tests.
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutines outlived the tests:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// control is a controlsvc process on a fixed loopback port, so that it can
// be killed and started again where the gateway expects it.
type control struct {
	t    *testing.T
	addr string
	env  []string
	cmd  *exec.Cmd
	done chan struct{}
	log  *bytes.Buffer
	mu   sync.Mutex
	// health is how readiness is read: plain HTTP unless the service
	// speaks TLS (set before start).
	health func(addr string) (*http.Response, error)
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func startControl(t *testing.T, redisAddr, config string) *control {
	t.Helper()
	return startControlEnv(t, redisAddr, config)
}

// startControlEnv is startControl with more TOLLGATE_* variables ("K=V").
func startControlEnv(t *testing.T, redisAddr, config string, env ...string) *control {
	t.Helper()
	return startControlWith(t, redisAddr, config, nil, env...)
}

// startControlWith is startControlEnv reading readiness with health (nil:
// plain HTTP).
func startControlWith(t *testing.T, redisAddr, config string, health func(addr string) (*http.Response, error), env ...string) *control {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tollgate.toml")
	if err := os.WriteFile(path, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	c := &control{t: t, addr: freeAddr(t), env: []string{
		"TOLLGATE_REDIS_URL=redis://" + redisAddr + "/0", "TOLLGATE_ADMIN_TOKEN=" + adminToken, "TOLLGATE_CONFIG=" + path,
		"TOLLGATE_DECISION_TOKEN=" + decisionToken,
	}, health: health}
	c.env = append(c.env, env...)
	c.start()
	t.Cleanup(c.kill)
	return c
}

func (c *control) start() {
	c.t.Helper()
	cmd := exec.Command(controlBin)
	cmd.Env = append(os.Environ(), append(c.env, "TOLLGATE_LISTEN="+c.addr)...)
	c.log = &bytes.Buffer{}
	cmd.Stdout, cmd.Stderr = c.log, c.log
	if err := cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
	c.cmd, c.done = cmd, make(chan struct{})
	go func() { _ = cmd.Wait(); close(c.done) }()
	// The process gives no readiness signal of its own beyond its port;
	// poll /health, bounded.
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-c.done:
			c.t.Fatalf("controlsvc exited: %s", c.log)
		default:
		}
		get := c.health
		if get == nil {
			get = func(addr string) (*http.Response, error) { return http.Get("http://" + addr + "/health") }
		}
		if resp, err := get(c.addr); err == nil {
			resp.Body.Close()
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	c.t.Fatalf("controlsvc did not listen on %s: %s", c.addr, c.log)
}

func (c *control) kill() {
	if c.cmd == nil {
		return
	}
	_ = c.cmd.Process.Signal(syscall.SIGKILL)
	<-c.done
	c.cmd = nil
}

func (c *control) admin(t *testing.T, method, path string, body any) map[string]any {
	t.Helper()
	b, _ := json.Marshal(body)
	req, _ := http.NewRequest(method, "http://"+c.addr+path, bytes.NewReader(b))
	req.Header.Set("Authorization", "Bearer "+adminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var m map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&m)
	if resp.StatusCode >= 300 {
		t.Fatalf("%s %s: %d %v", method, path, resp.StatusCode, m)
	}
	return m
}

// upstream records the headers of every request that reached it.
type upstream struct {
	*httptest.Server
	mu   sync.Mutex
	seen []http.Header
}

func newUpstream(t *testing.T) *upstream {
	u := &upstream{}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		h := r.Header.Clone()
		h.Set("X-Test-Body", string(body))
		h.Set("X-Test-Method", r.Method)
		h.Set("X-Test-URI", r.URL.RequestURI())
		u.mu.Lock()
		u.seen = append(u.seen, h)
		u.mu.Unlock()
		w.Header().Set("Content-Type", "text/plain")
		io.WriteString(w, "hello from upstream")
	}))
	t.Cleanup(u.Close)
	return u
}

func (u *upstream) last(t *testing.T) http.Header {
	t.Helper()
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.seen) == 0 {
		t.Fatal("nothing reached the upstream")
	}
	return u.seen[len(u.seen)-1]
}

// since returns the headers of the requests after the first n.
func (u *upstream) since(n int) []http.Header {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]http.Header(nil), u.seen[n:]...)
}

func (u *upstream) count() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.seen)
}

// startGateway runs the gateway with the compiled filter in-process, behind
// one trusted proxy: the tests play that proxy and say who the client is with
// X-Forwarded-For, so that one loopback test client can be many callers.
func startGateway(t *testing.T, ctl *control, up *upstream, pluginConfig string) string {
	t.Helper()
	return startGatewayHops(t, ctl, up, pluginConfig, 1)
}

// startGatewayHops runs the gateway with hops trusted proxies in front (0: the
// gateway is the edge, as shipped).
func startGatewayHops(t *testing.T, ctl *control, up *upstream, pluginConfig string, hops int) string {
	t.Helper()
	upURL, _ := url.Parse(up.URL)
	ctlURL, _ := url.Parse("http://" + ctl.addr)
	return serveGateway(t, gateway.Config{
		Wasm: wasmBytes, PluginConfig: []byte(pluginConfig), Upstream: upURL,
		Clusters: map[string]*url.URL{"controlsvc": ctlURL}, VMs: 2, CompilationCache: compCache,
		XFFTrustedHops: hops,
	})
}

// serveGateway runs a gateway of cfg on a loopback port until the test ends.
func serveGateway(t *testing.T, cfg gateway.Config) string {
	url, _ := serveGatewayOf(t, cfg)
	return url
}

// serveGatewayOf is serveGateway with the gateway itself (its host's metrics).
func serveGatewayOf(t *testing.T, cfg gateway.Config) (string, *gateway.Gateway) {
	t.Helper()
	g, err := gateway.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(g)
	srv.Config = g.HTTPServer()
	srv.Start()
	t.Cleanup(func() { srv.Close(); g.Close(context.Background()) })
	return srv.URL, g
}

type result struct {
	status int
	header http.Header
	body   []byte
}

func get(t *testing.T, base, path string, headers ...string) result {
	t.Helper()
	r, err := tryGet(base, path, headers...)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// tryGet is get for spawned goroutines, which must not call t.Fatal.
func tryGet(base, path string, headers ...string) (result, error) {
	req, err := http.NewRequest(http.MethodGet, base+path, nil)
	if err != nil {
		return result{}, err
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Add(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return result{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return result{resp.StatusCode, resp.Header, b}, err
}

const controlConfig = `
[[tiers]]
name = "free"
limit = 3
window_seconds = 60
[[tiers]]
name = "premium"
limit = 1000
window_seconds = 60
`

func pluginConfig(mode string) string {
	return `{"control_cluster":"controlsvc","failure_mode":"` + mode + `","decision_token":"` + decisionToken + `","timeout_ms":500,
		"lease":{"request":0},"breaker":{"failures":2,"cooldown_ms":100},"headers":{"ietf":true}}`
}

func TestEndToEnd(t *testing.T) {
	r := redistest.Start(t)
	ctl := startControl(t, r.Addr, controlConfig)
	up := newUpstream(t)
	gw := startGateway(t, ctl, up, pluginConfig("fail_open"))

	t.Run("allowed requests carry the headers", func(t *testing.T) {
		res := get(t, gw, "/api/v1/items", "X-Forwarded-For", "203.0.113.10")
		if res.status != 200 || string(res.body) != "hello from upstream" {
			t.Fatalf("%d %s", res.status, res.body)
		}
		for h, want := range map[string]string{"X-Ratelimit-Limit": "3", "X-Ratelimit-Remaining": "2", "Ratelimit-Policy": `"tier_free";q=3;w=60`} {
			if got := res.header.Get(h); got != want {
				t.Errorf("%s = %q, want %q", h, got, want)
			}
		}
		seen := up.last(t)
		if seen.Get("X-Tollgate-Identity") != "ip:203.0.113.10" || seen.Get("X-Tollgate-Tier") != "free" || seen.Get("X-Tollgate-Decision") != "allowed" {
			t.Fatalf("upstream saw %v", seen)
		}
	})

	t.Run("a request body reaches upstream after the callout", func(t *testing.T) {
		req, _ := http.NewRequest(http.MethodPost, gw+"/api/v1/orders", strings.NewReader(`{"item":42}`))
		req.Header.Set("X-Forwarded-For", "203.0.113.15")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		seen := up.last(t)
		if resp.StatusCode != 200 || seen.Get("X-Test-Method") != "POST" || seen.Get("X-Test-Body") != `{"item":42}` {
			t.Fatalf("%d; upstream saw %s %q", resp.StatusCode, seen.Get("X-Test-Method"), seen.Get("X-Test-Body"))
		}
	})

	t.Run("the limit answers 429 with body and Retry-After", func(t *testing.T) {
		var res result
		for i := 0; i < 4; i++ {
			res = get(t, gw, "/api/v1/orders", "X-Forwarded-For", "203.0.113.11")
		}
		if res.status != 429 || res.header.Get("Retry-After") == "" || res.header.Get("X-Ratelimit-Remaining") != "0" {
			t.Fatalf("4th request: %d %v", res.status, res.header)
		}
		var body struct {
			Error struct {
				Code    string         `json:"code"`
				Details map[string]any `json:"details"`
			} `json:"error"`
		}
		if err := json.Unmarshal(res.body, &body); err != nil || body.Error.Code != "RATE_LIMIT_EXCEEDED" || body.Error.Details["limit"] != 3.0 {
			t.Fatalf("429 body %s", res.body)
		}
	})

	t.Run("upstream never sees a forged identity", func(t *testing.T) {
		before := up.count()
		get(t, gw, "/api/v1/profile", "X-Forwarded-For", "203.0.113.12", "X-Tollgate-Identity", "user:admin", "X-Tollgate-Decision", "exempt")
		if up.count() != before+1 {
			t.Fatal("request did not reach upstream")
		}
		seen := up.last(t)
		if got := seen.Values("X-Tollgate-Identity"); len(got) != 1 || got[0] != "ip:203.0.113.12" {
			t.Fatalf("upstream identity %v", got)
		}
		if seen.Get("X-Tollgate-Decision") != "allowed" {
			t.Fatalf("upstream decision %q", seen.Get("X-Tollgate-Decision"))
		}
	})

	t.Run("API keys: premium tier, and key errors reach the client as sent", func(t *testing.T) {
		created := ctl.admin(t, "POST", "/admin/v1/api-keys", map[string]any{"user_id": "42", "tier": "premium"})
		key, id := created["api_key"].(string), created["key_id"].(string)
		res := get(t, gw, "/api/v1/items", "X-Api-Key", key)
		if res.status != 200 || res.header.Get("X-Ratelimit-Limit") != "1000" || up.last(t).Get("X-Tollgate-Identity") != "key:"+id {
			t.Fatalf("with key: %d %v, upstream %v", res.status, res.header, up.last(t))
		}
		res = get(t, gw, "/api/v1/items", "X-Api-Key", "tg_"+strings.Repeat("x", 43))
		if res.status != 401 || !strings.Contains(string(res.body), `"INVALID_API_KEY"`) {
			t.Fatalf("unknown key: %d %s", res.status, res.body)
		}
		ctl.admin(t, "POST", "/admin/v1/api-keys/"+id+"/revoke", nil)
		res = get(t, gw, "/api/v1/items", "X-Api-Key", key)
		if res.status != 403 || !strings.Contains(string(res.body), `"API_KEY_REVOKED"`) {
			t.Fatalf("revoked key: %d %s", res.status, res.body)
		}
	})

	t.Run("control service down fails open, and recovers", func(t *testing.T) {
		ctl.kill()
		for i := 0; i < 4; i++ {
			res := get(t, gw, "/api/v1/items", "X-Forwarded-For", "203.0.113.13")
			if res.status != 200 || up.last(t).Get("X-Tollgate-Decision") != "degraded" {
				t.Fatalf("while down: %d, upstream decision %q", res.status, up.last(t).Get("X-Tollgate-Decision"))
			}
		}
		ctl.start()
		// The filter's breaker probes again after its 100ms cooldown; ask
		// until a decision comes from the service, bounded.
		var res result
		for i := 0; i < 100; i++ {
			res = get(t, gw, "/api/v1/items", "X-Forwarded-For", "203.0.113.14")
			if up.last(t).Get("X-Tollgate-Decision") == "allowed" {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if res.status != 200 || res.header.Get("X-Ratelimit-Limit") != "3" {
			t.Fatalf("after the service came back: %d %v", res.status, res.header)
		}
	})
}

func TestControlServiceDownFailClosed(t *testing.T) {
	r := redistest.Start(t)
	ctl := startControl(t, r.Addr, controlConfig)
	up := newUpstream(t)
	gw := startGateway(t, ctl, up, pluginConfig("fail_closed"))
	if res := get(t, gw, "/x"); res.status != 200 {
		t.Fatalf("before: %d", res.status)
	}
	ctl.kill()
	before := up.count()
	res := get(t, gw, "/x")
	if res.status != 503 || !strings.Contains(string(res.body), "SERVICE_UNAVAILABLE") {
		t.Fatalf("fail_closed while down: %d %s", res.status, res.body)
	}
	if up.count() != before {
		t.Fatal("a request reached upstream while failing closed")
	}
}

// Usage counts the requests admitted through the filter with leases on,
// never tokens leased: each callout counts itself and reports the lease
// tokens its bucket spent since the last one (here six callouts: the first
// brings no lease, since a lease over the path's counter and the tier's
// total starts on the path's second call; the others each bring a lease of
// four that the next four requests spend locally, reported by the next
// callout; the last lease is unspent and counts nothing).
func TestUsageMatchesRequestsThroughLeases(t *testing.T) {
	r := redistest.Start(t)
	ctl := startControlEnv(t, r.Addr, "[[tiers]]\nname = \"free\"\nlimit = 1000\nwindow_seconds = 60\n", "TOLLGATE_LEASE_TTL_MS=60000")
	up := newUpstream(t)
	gw := startGateway(t, ctl, up, `{"control_cluster":"controlsvc","decision_token":"`+decisionToken+`","timeout_ms":500,"lease":{"request":4}}`)
	const n = 22
	for i := 0; i < n; i++ {
		if res := get(t, gw, "/api/v1/items", "X-Forwarded-For", "203.0.113.77"); res.status != 200 {
			t.Fatalf("request %d: %d %s", i, res.status, res.body)
		}
	}
	if up.count() != n {
		t.Fatalf("upstream saw %d requests", up.count())
	}
	// Leases were in play: five callouts brought four tokens each.
	resp, err := http.Get("http://" + ctl.addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(metrics), "tollgate_lease_tokens_granted_total 20\n") {
		t.Fatalf("leases granted: %s", grepLine(string(metrics), "tollgate_lease_tokens_granted_total"))
	}
	// The service writes usage every second: read until the last write is
	// in, bounded; it must never pass n.
	var made float64
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		u := ctl.admin(t, "GET", "/admin/v1/usage/ip:203.0.113.77", nil)
		made = u["current_window"].(map[string]any)["requests_made"].(float64)
		if made > n {
			t.Fatalf("usage %v is more than the %d requests made", made, n)
		}
		if made == n && u["last_24_hours"].(map[string]any)["total_requests"].(float64) == n {
			return
		}
	}
	t.Fatalf("usage reached %v, want %d", made, n)
}

func grepLine(text, prefix string) string {
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, prefix) {
			return l
		}
	}
	return "(none)"
}
