package filtertest

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/filter/devhost/wasmhost"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// BenchmarkCompile is the module's compile time without a cache, with its
// size in bytes.
func BenchmarkCompile(b *testing.B) {
	ctx := context.Background()
	for b.Loop() {
		h, err := wasmhost.New(ctx, wasmBytes, wasmhost.Options{})
		if err != nil {
			b.Fatal(err)
		}
		h.Close(ctx)
	}
	b.ReportMetric(float64(len(wasmBytes)), "module-bytes")
}

// BenchmarkInstantiate is one new VM (instantiate, _initialize, vm start,
// configure), with the guest memory it then holds.
func BenchmarkInstantiate(b *testing.B) {
	ctx := context.Background()
	h, err := wasmhost.New(ctx, wasmBytes, wasmhost.Options{PluginConfig: []byte(baseConfig), Clusters: []string{"controlsvc"}, CompilationCache: compCache})
	if err != nil {
		b.Fatal(err)
	}
	defer h.Close(ctx)
	var mem uint32
	for b.Loop() {
		vm, err := h.NewVM(ctx)
		if err != nil {
			b.Fatal(err)
		}
		mem = vm.MemorySize()
		vm.Close(ctx)
	}
	b.ReportMetric(float64(mem), "vm-memory-bytes")
}

var benchReq = wasmhost.Headers{{":method", "GET"}, {":path", "/api/v1/items"}, {":authority", "api"}, {":scheme", "http"},
	{"x-forwarded-for", "203.0.113.5, 10.0.0.1"}, {"user-agent", "bench"}}

var benchProps = map[string]string{"source.address": "10.0.0.1:5000"}

func benchVM(b *testing.B, config string) (*wasmhost.Host, *wasmhost.VM) {
	ctx := context.Background()
	h, err := wasmhost.New(ctx, wasmBytes, wasmhost.Options{PluginConfig: []byte(config), Clusters: []string{"controlsvc"}, CompilationCache: compCache, WASI: envoyWASI})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { h.Close(ctx) })
	vm, err := h.NewVM(ctx)
	if err != nil {
		b.Fatal(err)
	}
	return h, vm
}

var benchAnswer = wasmhost.CalloutResponse{Headers: wasmhost.Headers{{":status", "200"}}, Body: []byte(decision(true, 50, 0, 0))}

// BenchmarkRequestCallout is a whole request that calls out: context create,
// request headers, callout answer, response headers, done.
func BenchmarkRequestCallout(b *testing.B) {
	ctx := context.Background()
	_, vm := benchVM(b, `{"control_cluster":"controlsvc","lease":{"request":0}}`)
	b.ReportAllocs()
	allocs := guestAllocs(ctx, b, vm)
	for b.Loop() {
		s, _ := vm.NewStream(ctx, benchReq, benchProps)
		s.OnRequestHeaders(ctx, true)
		for _, c := range vm.PendingCallouts() {
			vm.Respond(ctx, c.Token, benchAnswer)
		}
		s.OnResponseHeaders(ctx, wasmhost.Headers{{":status", "200"}}, true)
		s.Done(ctx)
	}
	reportGuestAllocs(ctx, b, vm, allocs)
	b.ReportMetric(float64(vm.MemorySize()), "vm-memory-bytes")
}

// BenchmarkRequestLeaseHit is the fast path: the token comes from the shared
// lease cache, no callout. The filter takes at most the lease it asked for
// (10,000 tokens), so one request in 10,000 refills it with a callout.
func BenchmarkRequestLeaseHit(b *testing.B) { benchLeaseHit(b, benchReq, false) }

// BenchmarkRequestLeaseHitCold is the lease hit with the processor's caches
// swept before each request (8 MiB written), as in a proxy whose HTTP work
// runs between two requests through the filter: its ns-request is the
// request alone. Through the gateway benchmark the guest's share of a
// request is about twice the warm lease hit's: this is why.
func BenchmarkRequestLeaseHitCold(b *testing.B) { benchLeaseHit(b, benchReq, true) }

// sweepBuf is what a cold benchmark writes between requests: larger than
// the processor's second-level caches.
var sweepBuf = make([]byte, 8<<20)

// sweep writes a byte of every cache line of sweepBuf.
func sweep() {
	for i := 0; i < len(sweepBuf); i += 64 {
		sweepBuf[i]++
	}
}

// benchLeaseHit serves req from the lease cache over and over, refilling
// the lease when it runs out; cold sweeps the caches before each request.
func benchLeaseHit(b *testing.B, req wasmhost.Headers, cold bool) {
	ctx := context.Background()
	_, vm := benchVM(b, `{"control_cluster":"controlsvc","lease":{"request":10000}}`)
	refill := leaseRefill(ctx, vm)
	s, _ := vm.NewStream(ctx, req, benchProps)
	s.OnRequestHeaders(ctx, true)
	refill()
	s.Done(ctx)
	b.ReportAllocs()
	allocs := guestAllocs(ctx, b, vm)
	misses := 0
	var in time.Duration // in requests, when cold
	for b.Loop() {
		var t0 time.Time
		if cold {
			sweep()
			t0 = time.Now()
		}
		s, _ := vm.NewStream(ctx, req, benchProps)
		if act, _ := s.OnRequestHeaders(ctx, true); act != wasmhost.Continue {
			misses++
			refill()
		}
		s.OnResponseHeaders(ctx, wasmhost.Headers{{":status", "200"}}, true)
		s.Done(ctx)
		if cold {
			in += time.Since(t0)
		}
	}
	reportGuestAllocs(ctx, b, vm, allocs)
	b.ReportMetric(float64(misses), "refills")
	if cold {
		b.ReportMetric(float64(in.Nanoseconds())/float64(b.N), "ns-request")
	}
}

// browserReq is a lease hit's request as a browser sends it, through a
// proxy: twenty header fields, most of them none the filter reads.
var browserReq = wasmhost.Headers{{":method", "GET"}, {":path", "/api/v1/items"}, {":authority", "api.example.com"}, {":scheme", "https"},
	{"user-agent", "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0 Safari/537.36"},
	{"accept", "application/json, text/plain, */*"}, {"accept-language", "en-GB,en;q=0.9"}, {"accept-encoding", "gzip, deflate, br, zstd"},
	{"referer", "https://app.example.com/dashboard"}, {"origin", "https://app.example.com"}, {"sec-fetch-dest", "empty"},
	{"sec-fetch-mode", "cors"}, {"sec-fetch-site", "same-site"}, {"sec-ch-ua", `"Chromium";v="131", "Not_A Brand";v="24"`},
	{"sec-ch-ua-mobile", "?0"}, {"sec-ch-ua-platform", `"Linux"`}, {"cookie", "session=abc123; theme=dark"},
	{"x-forwarded-for", "203.0.113.5, 10.0.0.1"}, {"x-forwarded-proto", "https"}, {"x-request-id", "3f2a9c1e-8b7d-4e6f-a5b4-c3d2e1f0a9b8"},
	{"x-envoy-expected-rq-timeout-ms", "15000"}, {"priority", "u=1, i"}}

// BenchmarkRequestLeaseHitBrowser is the lease hit of a browser's request
// (browserReq): what reading twenty-odd header fields adds.
func BenchmarkRequestLeaseHitBrowser(b *testing.B) { benchLeaseHit(b, browserReq, false) }

// BenchmarkRequestDeniedFromCache is a refused client's flood: every
// request answered 429 from the cached denial, with the RATE_LIMIT_EXCEEDED
// envelope and the rate-limit headers, no callout.
func BenchmarkRequestDeniedFromCache(b *testing.B) {
	ctx := context.Background()
	_, vm := benchVM(b, `{"control_cluster":"controlsvc","lease":{"request":10}}`)
	denial := wasmhost.CalloutResponse{Headers: wasmhost.Headers{{":status", "429"}}, Body: []byte(decision(false, 0, 0, 3600))}
	b.ReportAllocs()
	allocs := guestAllocs(ctx, b, vm)
	calls := 0
	for b.Loop() {
		s, _ := vm.NewStream(ctx, benchReq, benchProps)
		s.OnRequestHeaders(ctx, true)
		for _, c := range vm.PendingCallouts() {
			calls++
			vm.Respond(ctx, c.Token, denial)
		}
		if s.Local == nil || s.Local.Status != 429 {
			b.Fatalf("not refused: %+v", s.Local)
		}
		s.Done(ctx)
	}
	reportGuestAllocs(ctx, b, vm, allocs)
	b.ReportMetric(float64(calls), "callouts")
}

// guestAllocs is the module's cumulative heap allocation count. The
// benchmark's allocs/op are the host's (wazero and wasmhost); the guest's Go
// heap is invisible to them, so the module counts its own.
func guestAllocs(ctx context.Context, b *testing.B, vm *wasmhost.VM) uint64 {
	n, ok := vm.GuestAllocs(ctx)
	if !ok {
		b.Fatal("the module does not export tollgate_debug_allocs")
	}
	return n
}

// reportGuestAllocs reports the guest's allocations per request since
// before (read just ahead of the loop).
func reportGuestAllocs(ctx context.Context, b *testing.B, vm *wasmhost.VM, before uint64) {
	b.ReportMetric(float64(guestAllocs(ctx, b, vm)-before)/float64(b.N), "guest-allocs/op")
}

// headersOnlyWasm is the module built without the response body callback
// (tag tollgate_headers_only), built once when a benchmark asks.
var headersOnlyWasm = sync.OnceValues(func() ([]byte, error) {
	dir, err := os.MkdirTemp("", "tollgate-wasm-headers-only")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	out := filepath.Join(dir, "tollgate.wasm")
	cmd := exec.Command("go", "build", "-buildmode=c-shared", "-tags", "tollgate_headers_only", "-o", out, "..")
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
	if b, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build: %v: %s", err, b)
	}
	return os.ReadFile(out)
})

// BenchmarkRequestLeaseHitWithBody is a lease hit whose request and
// response each have a body (one 4 KiB chunk), with the module as shipped
// ("body-callback": Envoy calls the exported body callbacks for each
// chunk, which return at once for a request that is no form POST and under
// no response-cost rule) and built without those exports ("headers-only"):
// their ratio is what reading LLM usage and form bodies' method overrides
// costs every other request. The filter never knows rules, so a
// response-cost rule configured for other paths changes nothing else on
// this path.
func BenchmarkRequestLeaseHitWithBody(b *testing.B) {
	chunk := make([]byte, 4096)
	for _, variant := range []string{"body-callback", "headers-only"} {
		b.Run(variant, func(b *testing.B) {
			ctx := context.Background()
			wasm := wasmBytes
			if variant == "headers-only" {
				var err error
				if wasm, err = headersOnlyWasm(); err != nil {
					b.Fatal(err)
				}
			}
			h, err := wasmhost.New(ctx, wasm, wasmhost.Options{PluginConfig: []byte(`{"control_cluster":"controlsvc","lease":{"request":10000}}`),
				Clusters: []string{"controlsvc"}, CompilationCache: compCache, WASI: envoyWASI})
			if err != nil {
				b.Fatal(err)
			}
			defer h.Close(ctx)
			vm, err := h.NewVM(ctx)
			if err != nil {
				b.Fatal(err)
			}
			refill := leaseRefill(ctx, vm)
			for b.Loop() {
				s, _ := vm.NewStream(ctx, benchReq, benchProps)
				if act, _ := s.OnRequestHeaders(ctx, false); act != wasmhost.Continue {
					refill()
				}
				if _, out, err := s.OnRequestBody(ctx, chunk, true); err != nil || len(out) != len(chunk) {
					b.Fatalf("the request body did not pass: %d bytes, %v", len(out), err)
				}
				s.OnResponseHeaders(ctx, wasmhost.Headers{{":status", "200"}}, false)
				if _, out, err := s.OnResponseBody(ctx, chunk, true); err != nil || len(out) != len(chunk) {
					b.Fatalf("the body did not pass: %d bytes, %v", len(out), err)
				}
				s.Done(ctx)
			}
		})
	}
}

// leaseRefill answers a VM's pending callouts with a lease of 10,000 tokens
// for a minute: a lease-hit benchmark refills once in 10,000 requests.
func leaseRefill(ctx context.Context, vm *wasmhost.VM) func() {
	body := leaseRefillBody()
	return func() {
		for _, c := range vm.PendingCallouts() {
			vm.Respond(ctx, c.Token, wasmhost.CalloutResponse{Headers: wasmhost.Headers{{":status", "200"}}, Body: body})
		}
	}
}

// leaseRefillBody is an admission with a lease of 10,000 tokens for a
// minute.
func leaseRefillBody() []byte {
	d := wire.CheckResponse{Allowed: true, Limit: 1 << 40, Remaining: 1 << 39, ResetAt: epoch.Unix(), RuleID: "r", WindowSeconds: 60,
		Lease: wire.Lease{Granted: 10000, TTLMs: 60_000}, Identity: "ip:203.0.113.5"}
	body, _ := json.Marshal(d)
	return body
}

// BenchmarkRequestJWTUncached is a request whose bearer token the filter
// verifies in full (two tokens alternate through a cache of one), for each
// algorithm: the cost a client sending new tokens puts on a VM, up to the
// callout.
func BenchmarkRequestJWTUncached(b *testing.B) {
	for _, alg := range []string{"HS256", "RS256", "ES256"} {
		b.Run(alg, func(b *testing.B) {
			ctx := context.Background()
			config := fmt.Sprintf(`{"control_cluster":"controlsvc","lease":{"request":0},"jwt":{"jwks":%s,"cache_size":1}}`, keys.JWKS())
			_, vm := benchVM(b, config)
			var reqs [2]wasmhost.Headers
			for i := range reqs {
				tok := keys.Sign(alg, map[string]any{"sub": fmt.Sprint("user", i), "exp": epoch.Unix() + 1<<30})
				reqs[i] = append(wasmhost.Headers{{"authorization", "Bearer " + tok}}, benchReq...)
			}
			i := 0
			for b.Loop() {
				s, _ := vm.NewStream(ctx, reqs[i%2], benchProps)
				s.OnRequestHeaders(ctx, true)
				for _, c := range vm.PendingCallouts() {
					if i < 2 && !strings.Contains(string(c.Body), `"user_id":"user:user`) {
						b.Fatalf("the token was not verified: %s", c.Body)
					}
					vm.Respond(ctx, c.Token, benchAnswer)
				}
				s.Done(ctx)
				i++
			}
		})
	}
}

// BenchmarkRequestJWTJunk is a flood of requests from one address whose
// bearer token fails a check made before its signature's (the issuer),
// after a payload of about 1,000 tiny claims, as long as a token may be,
// against the same requests without a token: what such a flood costs the
// VM. Each such token counts a check against its address, and past the 16
// of the second it is not read (attack 45 A1: read every time, 0.9 ms a
// request under the gateway, 20 times a plain refused request). What
// reading one costs, natively: jwt's BenchmarkVerifyManyClaims.
func BenchmarkRequestJWTJunk(b *testing.B) {
	claims := map[string]any{"sub": "a", "exp": epoch.Unix() + 1<<30, "iss": "someone-else"}
	for i := 0; len(keys.Sign("RS256", claims)) < 8192-16; i++ {
		claims[strconv.FormatInt(int64(i), 36)] = i % 10
	}
	junk := keys.Sign("RS256", claims)
	for _, tc := range []struct {
		name string
		req  wasmhost.Headers
	}{
		{"no token", benchReq},
		{"junk token", append(wasmhost.Headers{{"authorization", "Bearer " + junk}}, benchReq...)},
	} {
		b.Run(tc.name, func(b *testing.B) {
			ctx := context.Background()
			config := fmt.Sprintf(`{"control_cluster":"controlsvc","lease":{"request":0},"jwt":{"jwks":%s,"issuer":"https://issuer"}}`, keys.JWKS())
			_, vm := benchVM(b, config)
			for b.Loop() {
				s, _ := vm.NewStream(ctx, tc.req, benchProps)
				s.OnRequestHeaders(ctx, true)
				for _, c := range vm.PendingCallouts() {
					if !strings.Contains(string(c.Body), `"user_id":"ip:`) {
						b.Fatalf("the junk token was taken: %s", c.Body)
					}
					vm.Respond(ctx, c.Token, benchAnswer)
				}
				s.Done(ctx)
			}
		})
	}
}

// BenchmarkTickWatching is one tick of a VM watching the most buckets it
// watches (maxWatched, 64) for another VM's refills still in flight: what
// a slow control service costs each VM a millisecond.
func BenchmarkTickWatching(b *testing.B) {
	ctx := context.Background()
	h, err := wasmhost.New(ctx, wasmBytes, wasmhost.Options{PluginConfig: []byte(`{"control_cluster":"controlsvc","lease":{"request":10},"timeout_ms":60000}`),
		Clusters: []string{"controlsvc"}, CompilationCache: compCache, WASI: envoyWASI})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { h.Close(ctx) })
	var vms [2]*wasmhost.VM
	for i := range vms {
		if vms[i], err = h.NewVM(ctx); err != nil {
			b.Fatal(err)
		}
	}
	const watched = 64
	for i := range watched {
		props := map[string]string{"source.address": fmt.Sprintf("10.1.%d.%d:5000", i/250, i%250+1)}
		for _, vm := range vms { // the first VM leads, the second watches
			s, err := vm.NewStream(ctx, benchReq, props)
			if err != nil {
				b.Fatal(err)
			}
			if act, _ := s.OnRequestHeaders(ctx, true); act != wasmhost.Pause {
				b.Fatal("a request of a bucket being refilled went on")
			}
		}
	}
	if n := len(vms[1].PendingCallouts()); n != 0 || vms[1].TickPeriod() == 0 {
		b.Fatalf("the watching VM made %d callouts, ticks every %v", n, vms[1].TickPeriod())
	}
	b.ReportAllocs()
	allocs := guestAllocs(ctx, b, vms[1])
	for b.Loop() {
		if err := vms[1].Tick(ctx); err != nil {
			b.Fatal(err)
		}
	}
	reportGuestAllocs(ctx, b, vms[1], allocs)
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/watched, "ns/bucket")
}
