package filtertest

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/filter/devhost/wasmhost"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// clock is the guest's time, moved by tests instead of sleeping.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// env is one plugin with one or more VMs.
type env struct {
	t     *testing.T
	host  *wasmhost.Host
	vms   []*wasmhost.VM
	clock *clock
}

var epoch = time.Unix(1_800_000_000, 0)

func newEnv(t *testing.T, config string, vms int) *env {
	t.Helper()
	return newEnvWith(t, config, vms, nil)
}

// newEnvWith is newEnv with the VMs' environment (vm_config's
// environment_variables), "KEY=value" each.
func newEnvWith(t *testing.T, config string, vms int, environ []string) *env {
	t.Helper()
	ctx := context.Background()
	c := &clock{now: epoch}
	h, err := wasmhost.New(ctx, wasmBytes, wasmhost.Options{
		PluginConfig: []byte(config), Clusters: []string{"controlsvc"},
		Now: c.Now, CompilationCache: compCache, WASI: envoyWASI, Env: environ,
	})
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, host: h, clock: c}
	t.Cleanup(func() {
		// Under Envoy's WASI the module must never need the poller and
		// never call what Envoy refuses while it initialises or allocates.
		for i, vm := range e.vms {
			if n := vm.HostCalls("poll_oneoff"); n != 0 {
				t.Errorf("vm %d called poll_oneoff %d times under %v: Envoy 1.33-1.38 answer ENOSYS and Go's runtime dies of it (TestNothingArmsATimer names the cause)", i, n, envoyWASI)
			}
			if v := vm.Violations(); len(v) != 0 {
				t.Errorf("vm %d made calls Envoy refuses under %v: %v", i, envoyWASI, v)
			}
		}
		h.Close(ctx)
	})
	for i := 0; i < vms; i++ {
		vm, err := h.NewVM(ctx)
		if err != nil {
			t.Fatalf("new VM: %v", err)
		}
		e.vms = append(e.vms, vm)
	}
	return e
}

// req is a client request.
type req struct {
	method, path string
	headers      wasmhost.Headers
	source       string
	vm           int
	body         bool // a body follows the headers (end_of_stream false)
}

// start runs request headers; it returns the stream and the action.
func (e *env) start(r req) (*wasmhost.Stream, wasmhost.Action) {
	e.t.Helper()
	if r.method == "" {
		r.method = "GET"
	}
	if r.path == "" {
		r.path = "/api/v1/items"
	}
	if r.source == "" {
		r.source = "198.51.100.7:40000"
	}
	h := append(wasmhost.Headers{{":method", r.method}, {":path", r.path}, {":authority", "api.example"}, {":scheme", "http"}}, r.headers...)
	vm := e.vms[r.vm]
	s, err := vm.NewStream(context.Background(), h, map[string]string{"source.address": r.source})
	if err != nil {
		e.t.Fatal(err)
	}
	act, err := s.OnRequestHeaders(context.Background(), !r.body)
	if err != nil {
		e.t.Fatalf("request headers: %v (logs %v)", err, vm.Logs())
	}
	return s, act
}

// callout returns the one pending callout of a VM and its decoded body.
func (e *env) callout(vm int) (*wasmhost.Callout, wire.CheckRequest) {
	e.t.Helper()
	cs := e.vms[vm].PendingCallouts()
	if len(cs) != 1 {
		e.t.Fatalf("%d pending callouts, want 1 (logs %v)", len(cs), e.vms[vm].Logs())
	}
	var body wire.CheckRequest
	if err := json.Unmarshal(cs[0].Body, &body); err != nil {
		e.t.Fatalf("callout body %s: %v", cs[0].Body, err)
	}
	return cs[0], body
}

func (e *env) noCallout(vm int) {
	e.t.Helper()
	if cs := e.vms[vm].PendingCallouts(); len(cs) != 0 {
		e.t.Fatalf("%d unexpected callouts", len(cs))
	}
}

// answer delivers a control-service answer to the pending callout.
func (e *env) answer(vm int, status string, body string) {
	e.t.Helper()
	c, _ := e.callout(vm)
	err := e.vms[vm].Respond(context.Background(), c.Token, wasmhost.CalloutResponse{
		Headers: wasmhost.Headers{{":status", status}, {"content-type", "application/json"}}, Body: []byte(body)})
	if err != nil {
		e.t.Fatal(err)
	}
}

// decision builds a control-service decision body.
func decision(allowed bool, remaining, granted, retry int64) string {
	d := wire.CheckResponse{Allowed: allowed, Limit: 100, Remaining: remaining, ResetAt: epoch.Unix() + 60,
		RetryAfter: retry, Strategy: "token_bucket", WindowSeconds: 60, RuleID: "tier_free",
		Lease: wire.Lease{Granted: granted, TTLMs: 1000}, Identity: "user:alice", Tier: "free"}
	b, _ := json.Marshal(d)
	return string(b)
}

// respond runs the upstream's response headers through the filter.
func respond(t *testing.T, s *wasmhost.Stream) wasmhost.Headers {
	t.Helper()
	if _, err := s.OnResponseHeaders(context.Background(), wasmhost.Headers{{":status", "200"}, {"content-type", "text/plain"}}, true); err != nil {
		t.Fatal(err)
	}
	return s.ResponseHeaders
}

func mustJSON(t *testing.T, b []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("not JSON: %s", b)
	}
	return m
}

// envoyWASI is the WASI the behaviour suite runs under this time: TestMain
// runs the suite once under each Envoy's (see main_test.go).
var envoyWASI = wasmhost.WASIEnvoy

const baseConfig = `{"control_cluster":"controlsvc","lease":{"request":0}}`

func hasLog(vm *wasmhost.VM, sub string) bool {
	for _, l := range vm.Logs() {
		if strings.Contains(l.Msg, sub) {
			return true
		}
	}
	return false
}
