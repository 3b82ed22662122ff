//go:build !wasip1 || tollgate_fakehost

package plugin_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/filter/internal/plugin"
	"github.com/tollgate-rl/tollgate/filter/proxywasm/hostmodel"
	"github.com/tollgate-rl/tollgate/filter/proxywasm/proxytest"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// The plugin's logic natively, against proxytest; the same behaviours run
// against the compiled module in filtertest.

func newHost(t testing.TB, config string) *proxytest.Host {
	t.Helper()
	h, err := proxytest.New(plugin.VM{}, []byte(config), "controlsvc")
	if err != nil {
		t.Fatal(err)
	}
	return h
}

var request = hostmodel.Headers{{":method", "GET"}, {":path", "/api/v1/items"}, {":authority", "api"}, {":scheme", "http"},
	{"x-forwarded-for", "203.0.113.5, 10.0.0.1"}, {"x-tollgate-identity", "forged"}}

var props = map[string]string{"source.address": "10.0.0.1:5000"}

// benchRequest and the benchmarks' configurations are filtertest's (its
// benchReq), so that a native figure and a Wasm one are the same request.
var benchRequest = hostmodel.Headers{{":method", "GET"}, {":path", "/api/v1/items"}, {":authority", "api"}, {":scheme", "http"},
	{"x-forwarded-for", "203.0.113.5, 10.0.0.1"}, {"user-agent", "bench"}}

func answer(allowed bool, granted int64) hostmodel.CalloutResponse {
	status := "200"
	if !allowed {
		status = "429"
	}
	d := wire.CheckResponse{Allowed: allowed, Limit: 100, Remaining: 50, ResetAt: time.Now().Unix() + 60, WindowSeconds: 60,
		RuleID: "tier_free", Lease: wire.Lease{Granted: granted, TTLMs: 60_000}, Identity: "ip:203.0.113.5", Tier: "free"}
	if !allowed {
		d.Remaining, d.RetryAfter = 0, 30
	}
	b, _ := json.Marshal(d)
	return hostmodel.CalloutResponse{Headers: hostmodel.Headers{{":status", status}}, Body: b}
}

func TestNativeAllowAndDeny(t *testing.T) {
	h := newHost(t, `{"xff_trusted_hops":1,"lease":{"request":0}}`)
	s := h.NewStream(request, props)
	if a := s.OnRequestHeaders(true); a != hostmodel.Pause {
		t.Fatalf("action %v; logs %v", a, h.Logs())
	}
	cs := h.PendingCallouts()
	var body wire.CheckRequest
	if len(cs) != 1 || json.Unmarshal(cs[0].Body, &body) != nil || body.UserID != "ip:203.0.113.5" {
		t.Fatalf("callouts %v", cs)
	}
	h.Respond(cs[0].Token, answer(true, 0))
	if !s.Resumed || s.RequestHeaders.Value("x-tollgate-identity") != "ip:203.0.113.5" {
		t.Fatalf("allowed: %+v", s)
	}
	s.OnResponseHeaders(hostmodel.Headers{{":status", "200"}}, true)
	if s.ResponseHeaders.Value("x-ratelimit-limit") != "100" {
		t.Fatalf("response headers %v", s.ResponseHeaders)
	}
	s.Done()

	s = h.NewStream(request, props)
	s.OnRequestHeaders(true)
	h.Respond(h.PendingCallouts()[0].Token, answer(false, 0))
	if s.Local == nil || s.Local.Status != 429 || s.Local.Headers.Value("retry-after") != "30" {
		t.Fatalf("denied: %+v", s.Local)
	}
	if h.Counter("tollgate_denied_total") != 1 || h.Counter("tollgate_allowed_total") != 1 {
		t.Fatal("counters")
	}
}

func TestNativeBadConfig(t *testing.T) {
	if _, err := proxytest.New(plugin.VM{}, []byte(`{"failure_mode":"maybe"}`), "controlsvc"); err == nil {
		t.Fatal("bad config accepted")
	}
}

// BenchmarkNativeRequestCallout is filtertest's BenchmarkRequestCallout with
// the plugin compiled natively: the ratio shows what Wasm costs.
func BenchmarkNativeRequestCallout(b *testing.B) {
	h := newHost(b, `{"control_cluster":"controlsvc","lease":{"request":0}}`)
	resp := answer(true, 0)
	b.ReportAllocs()
	for b.Loop() {
		s := h.NewStream(benchRequest, props)
		s.OnRequestHeaders(true)
		for _, c := range h.PendingCallouts() {
			h.Respond(c.Token, resp)
		}
		s.OnResponseHeaders(hostmodel.Headers{{":status", "200"}}, true)
		s.Done()
	}
}

// BenchmarkNativeLeaseHit is the fast path natively. The filter takes at
// most the lease it asked for (10,000 tokens), so one request in 10,000
// refills it with a callout, as in filtertest's BenchmarkRequestLeaseHit.
func BenchmarkNativeLeaseHit(b *testing.B) { benchNativeLeaseHit(b, false) }

// BenchmarkNativeLeaseHitCold is filtertest's BenchmarkRequestLeaseHitCold
// natively: the caches swept (8 MiB written) before each request, whose
// own time is ns-request.
func BenchmarkNativeLeaseHitCold(b *testing.B) { benchNativeLeaseHit(b, true) }

var sweepBuf = make([]byte, 8<<20)

func benchNativeLeaseHit(b *testing.B, cold bool) {
	h := newHost(b, `{"control_cluster":"controlsvc","lease":{"request":10000}}`)
	grant := answer(true, 10000)
	refill := func() {
		for _, c := range h.PendingCallouts() {
			h.Respond(c.Token, grant)
		}
	}
	s := h.NewStream(benchRequest, props)
	s.OnRequestHeaders(true)
	refill()
	s.Done()
	b.ReportAllocs()
	misses := 0
	var in time.Duration // in requests, when cold
	for b.Loop() {
		var t0 time.Time
		if cold {
			for i := 0; i < len(sweepBuf); i += 64 {
				sweepBuf[i]++
			}
			t0 = time.Now()
		}
		s := h.NewStream(benchRequest, props)
		if s.OnRequestHeaders(true) != hostmodel.Continue {
			misses++
			refill()
		}
		s.OnResponseHeaders(hostmodel.Headers{{":status", "200"}}, true)
		s.Done()
		if cold {
			in += time.Since(t0)
		}
	}
	b.ReportMetric(float64(misses), "refills")
	if cold {
		b.ReportMetric(float64(in.Nanoseconds())/float64(b.N), "ns-request")
	}
}

// Every header the filter reads is still read among a browser's twenty
// others (readLengths passes over names of lengths it reads none of),
// whatever the configured API key and cost header names' lengths.
func TestNativeReadsHeadersAmongOthers(t *testing.T) {
	noise := hostmodel.Headers{{"user-agent", "Mozilla/5.0"}, {"accept", "*/*"}, {"accept-language", "en"}, {"accept-encoding", "gzip"},
		{"referer", "https://a.example/"}, {"origin", "https://a.example"}, {"sec-fetch-dest", "empty"}, {"sec-fetch-mode", "cors"},
		{"sec-ch-ua-platform", `"Linux"`}, {"cookie", "a=b"}, {"x-envoy-expected-rq-timeout-ms", "15000"}, {"priority", "u=1"},
		{"a-header-name-longer-than-sixty-four-bytes-which-no-bitmask-holds-at-all", "x"}}
	config := `{"lease":{"request":0},"api_key_header":"x-a-rather-long-api-key-header-name","cost_headers":["x-units-of-work-done"]}`
	for _, tc := range []struct {
		name  string
		extra hostmodel.Headers
		check func(t *testing.T, h *proxytest.Host, s *proxytest.Stream)
	}{
		{"forged x-tollgate-* removed", hostmodel.Headers{{"x-tollgate-tier", "forged"}}, noForged},
		{"forged x-tollgate-* of a length read nowhere removed", hostmodel.Headers{{"x-tollgate-abcdefgh", "forged"}}, noForged},
		{"forged x-tollgate-* past 64 bytes removed", hostmodel.Headers{{"X-Tollgate-A-Very-Long-Forged-Header-Name-Past-Sixty-Four-Bytes-Long", "forged"}}, noForged},
		{"two Authorization headers refused", hostmodel.Headers{{"authorization", "Bearer a"}, {"authorization", "Bearer b"}},
			wantLocal(400, "more than one Authorization header")},
		{"two API keys refused", hostmodel.Headers{{"x-a-rather-long-api-key-header-name", "k1"}, {"x_a_rather_long_api_key_header_name", "k2"}},
			wantLocal(400, "more than one x-a-rather-long-api-key-header-name header")},
		{"request id quoted", hostmodel.Headers{{"x-request-id", "req-7"}, {"x-api-key", "not this one"}, {"authorization", "Bearer a"}, {"authorization", "Bearer b"}},
			wantLocal(400, `"request_id":"req-7"`)},
		{"a method override that names no method refused", hostmodel.Headers{{"x-http-method-override", "NOT A METHOD"}},
			wantLocal(400, "must name one HTTP method")},
		{"cost header and API key sent", hostmodel.Headers{{"x-units-of-work-done", "12"}, {"x-a-rather-long-api-key-header-name", "k1"}, {"content-length", "0"}},
			func(t *testing.T, h *proxytest.Host, _ *proxytest.Stream) {
				cs := h.PendingCallouts()
				var body wire.CheckRequest
				if len(cs) != 1 || json.Unmarshal(cs[0].Body, &body) != nil || body.CostHeaders["x-units-of-work-done"] != "12" || body.APIKey != "k1" {
					t.Errorf("callout %s", cs[0].Body)
				}
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHost(t, config)
			req := append(append(append(hostmodel.Headers{}, request[:5]...), noise...), tc.extra...)
			s := h.NewStream(req, props)
			s.OnRequestHeaders(true)
			tc.check(t, h, s)
		})
	}
}

func noForged(t *testing.T, _ *proxytest.Host, s *proxytest.Stream) {
	for _, kv := range s.RequestHeaders {
		if kv[1] == "forged" {
			t.Errorf("forged header kept: %v", kv)
		}
	}
}

func wantLocal(status int, text string) func(t *testing.T, h *proxytest.Host, s *proxytest.Stream) {
	return func(t *testing.T, _ *proxytest.Host, s *proxytest.Stream) {
		if s.Local == nil || s.Local.Status != status || !strings.Contains(string(s.Local.Body), text) {
			t.Errorf("answer %+v, want %d with %q", s.Local, status, text)
		}
	}
}
