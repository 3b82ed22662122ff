package app_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tollgate-rl/tollgate/controlsvc/internal/app"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/rls"
	"github.com/tollgate-rl/tollgate/shared/paths"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

const rlsYAML = `
domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: bucket
    rate_limit: {unit: minute, requests_per_unit: 2, algorithm: token_bucket, burst: 4}
  - key: health
    rate_limit: {unlimited: true}
  - key: daily
    rate_limit: {unit: day, requests_per_unit: 3}
`

// rlsService starts the control service with its gRPC listener and the
// given YAML as rls_config, and returns a client of it.
func rlsService(t testing.TB, yaml, toml string, env map[string]string) (*service, rlspb.RateLimitServiceClient, string) {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, "rls.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	vars := map[string]string{"TOLLGATE_GRPC_LISTEN": "127.0.0.1:0", "TOLLGATE_RLS_CONFIG": path}
	for k, v := range env {
		vars[k] = v
	}
	s := startService(t, toml, vars)
	conn, err := grpc.NewClient(s.app.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithUnaryInterceptor(callTimeout))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return s, rlspb.NewRateLimitServiceClient(conn), path
}

// withToken is a call context holding tok; the client's calls are bounded
// by callTimeout.
func withToken(tok string) context.Context {
	return metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+tok)
}

// callTimeout bounds every call of a test client.
func callTimeout(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return invoker(ctx, method, req, reply, cc, opts...)
}

func desc(kv ...string) *ratelimitv3.RateLimitDescriptor {
	d := &ratelimitv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func TestRLSAnswers(t *testing.T) {
	s, c, _ := rlsService(t, rlsYAML, "", nil)
	ctx := withToken(decisionToken)
	ask := func(hits uint32, ds ...*ratelimitv3.RateLimitDescriptor) *rlspb.RateLimitResponse {
		t.Helper()
		r, err := c.ShouldRateLimit(ctx, &rlspb.RateLimitRequest{Domain: "api", Descriptors: ds, HitsAddend: hits})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	// Three a minute: OK with 2, 1, 0 left, then over.
	for i, want := range []uint32{2, 1, 0} {
		r := ask(0, desc("user", "alice"))
		st := r.Statuses[0]
		if r.OverallCode != rlspb.RateLimitResponse_OK || st.LimitRemaining != want || st.CurrentLimit.GetRequestsPerUnit() != 3 ||
			st.CurrentLimit.GetUnit() != rlspb.RateLimitResponse_RateLimit_MINUTE || st.DurationUntilReset.AsDuration() <= 0 {
			t.Fatalf("call %d: %v", i, r)
		}
	}
	r := ask(0, desc("user", "alice"), desc("user", "bob"), desc("health", "x"), desc("nothing", "here"))
	if r.OverallCode != rlspb.RateLimitResponse_OVER_LIMIT || r.Statuses[0].Code != rlspb.RateLimitResponse_OVER_LIMIT ||
		r.Statuses[1].Code != rlspb.RateLimitResponse_OK || r.Statuses[1].LimitRemaining != 2 ||
		r.Statuses[2].LimitRemaining != 1<<32-1 || r.Statuses[2].CurrentLimit != nil ||
		r.Statuses[3].CurrentLimit != nil || r.Statuses[3].LimitRemaining != 0 {
		t.Fatalf("mixed call: %v", r)
	}
	headers := map[string]string{}
	for _, h := range r.ResponseHeadersToAdd {
		headers[h.Key] = h.Value
	}
	if headers["x-ratelimit-limit"] != "3" || headers["x-ratelimit-remaining"] != "0" || headers["x-ratelimit-window"] != "60" {
		t.Fatalf("headers of the refusing descriptor: %v", headers)
	}
	// hits_addend: the descriptor's own wins; every hit counts, refused or not.
	d := desc("user", "carol")
	d.HitsAddend = wrapperspb.UInt64(2)
	if r := ask(5, d); r.Statuses[0].LimitRemaining != 1 {
		t.Fatalf("descriptor hits_addend 2: %v", r)
	}
	if r := ask(5, desc("user", "carol")); r.Statuses[0].Code != rlspb.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("request hits_addend 5: %v", r)
	}
	zero := desc("user", "dave")
	zero.HitsAddend = wrapperspb.UInt64(0)
	if r := ask(0, zero); r.Statuses[0].LimitRemaining != 3 {
		t.Fatalf("hits_addend 0 reads: %v", r)
	}
	// A Tollgate algorithm on a descriptor: a token bucket of 4.
	for i := 0; i < 4; i++ {
		if r := ask(0, desc("bucket", "b")); r.OverallCode != rlspb.RateLimitResponse_OK {
			t.Fatalf("bucket call %d: %v", i, r)
		}
	}
	if r := ask(0, desc("bucket", "b")); r.OverallCode != rlspb.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("fifth bucket call: %v", r)
	}
	// The same /metrics.
	m := s.do("GET", "/metrics", nil)
	for _, want := range []string{`tollgate_rls_decisions_total{code="over_limit",domain="api"}`, `tollgate_rls_decisions_total{code="unlimited",domain="api"}`} {
		if !strings.Contains(string(m.body), want) {
			t.Fatalf("/metrics lacks %s", want)
		}
	}
}

func hasHeader(r *rlspb.RateLimitResponse, name string) bool {
	for _, h := range r.ResponseHeadersToAdd {
		if h.Key == name {
			return true
		}
	}
	return false
}

// shadow_mode: everything is counted, nothing answered OVER_LIMIT.
func TestRLSShadowMode(t *testing.T) {
	_, c, _ := rlsService(t, rlsYAML, "", map[string]string{"TOLLGATE_SHADOW_MODE": "true"})
	for i := 0; i < 5; i++ {
		r, err := c.ShouldRateLimit(withToken(decisionToken), &rlspb.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("user", "off")}})
		if err != nil || r.OverallCode != rlspb.RateLimitResponse_OK {
			t.Fatalf("call %d with rate limiting off: %v %v", i, r, err)
		}
		if i == 4 && r.Statuses[0].Code != rlspb.RateLimitResponse_OVER_LIMIT {
			t.Fatalf("the descriptor no longer says it is past its limit: %v", r)
		}
	}
}

// enabled = false: every descriptor OK, nothing counted.
func TestRLSDisabled(t *testing.T) {
	s, c, _ := rlsService(t, rlsYAML, "", map[string]string{"TOLLGATE_ENABLED": "false"})
	for i := 0; i < 5; i++ {
		r, err := c.ShouldRateLimit(withToken(decisionToken), &rlspb.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("user", "off"), desc("daily", "d")}})
		if err != nil || r.OverallCode != rlspb.RateLimitResponse_OK || len(r.Statuses) != 2 || r.Statuses[0].Code != rlspb.RateLimitResponse_OK {
			t.Fatalf("call %d with rate limiting off: %v %v", i, r, err)
		}
	}
	if n := s.dbsize(); n != 0 {
		t.Fatalf("%d keys in Redis with rate limiting off", n)
	}
}

// rls_ietf_headers adds the IETF fields; header_prefix names the others.
func TestRLSHeaderSettings(t *testing.T) {
	_, c, _ := rlsService(t, rlsYAML, "", map[string]string{"TOLLGATE_RLS_IETF_HEADERS": "true", "TOLLGATE_HEADER_PREFIX": "X-Quota-"})
	r, err := c.ShouldRateLimit(withToken(decisionToken), &rlspb.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("user", "hdr")}})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, h := range r.ResponseHeadersToAdd {
		got[h.Key] = h.Value
	}
	if got["x-quota-remaining"] != "2" || got["ratelimit-policy"] != `"api.user";q=3;w=60` || !strings.HasPrefix(got["ratelimit"], `"api.user";r=2;t=`) {
		t.Fatalf("headers %v", got)
	}
}

// The tollgate domain: Tollgate's tiers, rules and keys, reached through
// descriptor entries.
func TestRLSTollgateDomain(t *testing.T) {
	toml := `
[[tiers]]
name = "free"
limit = 2
window_seconds = 60
per_endpoint = false
`
	s, c, _ := rlsService(t, rlsYAML, toml, nil)
	ctx := withToken(decisionToken)
	ask := func(ds ...*ratelimitv3.RateLimitDescriptor) (*rlspb.RateLimitResponse, error) {
		return c.ShouldRateLimit(ctx, &rlspb.RateLimitRequest{Domain: rls.TollgateDomain, Descriptors: ds})
	}
	for i := 0; i < 2; i++ {
		r, err := ask(desc(rls.KeyRemoteAddress, "192.0.2.7", rls.KeyPath, "/items?x=1", rls.KeyMethod, "GET"))
		if err != nil || r.OverallCode != rlspb.RateLimitResponse_OK {
			t.Fatalf("call %d: %v %v", i, r, err)
		}
	}
	r, err := ask(desc(rls.KeyRemoteAddress, "192.0.2.7", rls.KeyPath, "/other", rls.KeyMethod, "GET"))
	if err != nil || r.OverallCode != rlspb.RateLimitResponse_OVER_LIMIT || r.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 2 {
		t.Fatalf("third call, another path, same tier: %v %v", r, err)
	}
	// The same counter as the HTTP check API's.
	st := s.do("POST", wire.PathCheck, map[string]any{"user_id": "ip:192.0.2.7", "endpoint": "/items"}, "Authorization", "Bearer "+decisionToken)
	if st.status != 429 {
		t.Fatalf("the HTTP API sees %d for the same caller", st.status)
	}
	// What the client chooses never turns the decision into an error: a
	// method no rule reads, a malformed path, a bad key are refused.
	for _, d := range []*ratelimitv3.RateLimitDescriptor{
		desc(rls.KeyUser, "mallory", rls.KeyMethod, "get"),
		desc(rls.KeyUser, "mallory", rls.KeyPath, "/a/%zz"),
		desc(rls.KeyRemoteAddress, "192.0.2.8", rls.KeyAPIKey, "ak_live_"+strings.Repeat("x", 43)),
	} {
		r, err := ask(d)
		if err != nil || r.OverallCode != rlspb.RateLimitResponse_OVER_LIMIT || !hasHeader(r, "x-tollgate-refused") {
			t.Errorf("%v: %v %v, want OVER_LIMIT with x-tollgate-refused", d, r, err)
		}
	}
	// A long query string is no part of the path: the call is counted.
	if r, err := ask(desc(rls.KeyRemoteAddress, "192.0.2.9", rls.KeyPath, "/items?q="+strings.Repeat("x", 3000))); err != nil || r.OverallCode != rlspb.RateLimitResponse_OK || r.Statuses[0].LimitRemaining != 1 {
		t.Fatalf("a long query string: %v %v", r, err)
	}
	// IPv6 callers are counted by their /64, as the filter counts them.
	for i := 0; i < 3; i++ {
		r, err := ask(desc(rls.KeyRemoteAddress, fmt.Sprintf("2001:db8:1:2::%x", i+1)))
		if want := i == 2; err != nil || (r.OverallCode == rlspb.RateLimitResponse_OVER_LIMIT) != want {
			t.Fatalf("IPv6 address %d of one /64: %v %v", i, r, err)
		}
	}
	for _, bad := range []struct {
		d    *ratelimitv3.RateLimitDescriptor
		want string
	}{
		{desc("tollgate.nope", "x"), `descriptors[0].entries[0].key: "tollgate.nope" is not a key of the tollgate domain`},
		{desc(rls.KeyPath, "/x"), "descriptors[0]: names no caller"},
		{desc(rls.KeyRemoteAddress, "not-an-ip"), "is not an address"},
	} {
		if _, err := ask(bad.d); status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), bad.want) {
			t.Errorf("%v: %v, want InvalidArgument naming %q", bad.d, err, bad.want)
		}
	}
}

// Hostile calls: each refused whole with a status that names the field, or
// answered as the peer answers (an unknown domain has no limits).
func TestRLSHostile(t *testing.T) {
	_, c, _ := rlsService(t, rlsYAML, "", nil)
	many := make([]*ratelimitv3.RateLimitDescriptor, rls.MaxDescriptors+1)
	for i := range many {
		many[i] = desc("user", "u")
	}
	long := desc("user", "u")
	for len(long.Entries) <= rls.MaxEntries {
		long.Entries = append(long.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: "k", Value: "v"})
	}
	huge := desc("user", "u")
	huge.HitsAddend = wrapperspb.UInt64(1 << 62)
	for _, tc := range []struct {
		name string
		ctx  context.Context
		req  *rlspb.RateLimitRequest
		code codes.Code
		want string
	}{
		{"no token", context.Background(), &rlspb.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("user", "u")}}, codes.Unauthenticated, "metadata authorization"},
		{"wrong token", withToken("not-the-token-0123456789abcdefghijkl"), &rlspb.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("user", "u")}}, codes.Unauthenticated, "not a decision token"},
		{"two tokens", metadata.AppendToOutgoingContext(withToken(decisionToken), "authorization", "Bearer "+decisionToken), &rlspb.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("user", "u")}}, codes.Unauthenticated, "more than once"},
		{"empty domain", withToken(decisionToken), &rlspb.RateLimitRequest{Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("user", "u")}}, codes.InvalidArgument, "domain: empty"},
		{"long domain", withToken(decisionToken), &rlspb.RateLimitRequest{Domain: strings.Repeat("d", rls.MaxValueLen+1), Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("user", "u")}}, codes.InvalidArgument, "domain: longer than"},
		{"no descriptors", withToken(decisionToken), &rlspb.RateLimitRequest{Domain: "api"}, codes.InvalidArgument, "descriptors: empty"},
		{"too many descriptors", withToken(decisionToken), &rlspb.RateLimitRequest{Domain: "api", Descriptors: many}, codes.InvalidArgument, "descriptors: 65 descriptors"},
		{"too many entries", withToken(decisionToken), &rlspb.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{long}}, codes.InvalidArgument, "descriptors[0].entries: 17 entries"},
		{"empty entries", withToken(decisionToken), &rlspb.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{{}}}, codes.InvalidArgument, "descriptors[0].entries: empty"},
		{"empty key", withToken(decisionToken), &rlspb.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("", "v")}}, codes.InvalidArgument, "descriptors[0].entries[0].key: empty"},
		{"long key", withToken(decisionToken), &rlspb.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc(strings.Repeat("k", rls.MaxKeyLen+1), "v")}}, codes.InvalidArgument, "entries[0].key: longer than"},
		{"huge hits_addend", withToken(decisionToken), &rlspb.RateLimitRequest{Domain: "api", HitsAddend: 1 << 31, Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("user", "u")}}, codes.InvalidArgument, "hits_addend: 2147483648 is more than"},
		{"huge descriptor hits_addend", withToken(decisionToken), &rlspb.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{huge}}, codes.InvalidArgument, "descriptors[0].hits_addend"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.ShouldRateLimit(tc.ctx, tc.req)
			if status.Code(err) != tc.code || !strings.Contains(status.Convert(err).Message(), tc.want) {
				t.Fatalf("%v, want %v naming %q", err, tc.code, tc.want)
			}
		})
	}
	// A long value (a client chooses header values) is counted, never
	// refused: two that differ only past the bound count apart.
	longValue := strings.Repeat("v", 3*rls.MaxValueLen)
	for i, want := range []uint32{2, 1} {
		r, err := c.ShouldRateLimit(withToken(decisionToken), &rlspb.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("user", longValue+"a")}})
		if err != nil || r.Statuses[0].LimitRemaining != want {
			t.Fatalf("long value, call %d: %v %v", i, r, err)
		}
	}
	if r, err := c.ShouldRateLimit(withToken(decisionToken), &rlspb.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("user", longValue+"b")}}); err != nil || r.Statuses[0].LimitRemaining != 2 {
		t.Fatalf("another long value shares a counter: %v %v", r, err)
	}
	// An unknown domain has no limits, as with the peer.
	r, err := c.ShouldRateLimit(withToken(decisionToken), &rlspb.RateLimitRequest{Domain: "elsewhere", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("user", "u")}})
	if err != nil || r.OverallCode != rlspb.RateLimitResponse_OK || r.Statuses[0].CurrentLimit != nil {
		t.Fatalf("unknown domain: %v %v", r, err)
	}
	// Metadata beyond 64 KiB is refused, token or not.
	padded := metadata.AppendToOutgoingContext(withToken(decisionToken), "x-pad", strings.Repeat("p", 100<<10))
	if _, err := c.ShouldRateLimit(padded, &rlspb.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("user", "u")}}); err == nil {
		t.Fatal("100 KiB of metadata was accepted")
	}
	// A message past 256 KiB (no call of Envoy's comes near) is refused
	// before it is read whole: a held message is buffered with no deadline.
	big := desc("user", strings.Repeat("v", 300<<10))
	if _, err := c.ShouldRateLimit(withToken(decisionToken), &rlspb.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{big}}); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("300 KiB message: %v", err)
	}
}

// The YAML reloads when it changes; a broken edit keeps the last good one.
func TestRLSReload(t *testing.T) {
	s, c, path := rlsService(t, rlsYAML, "", nil)
	if err := s.app.WatchConfig(t.Context()); err != nil {
		t.Fatal(err)
	}
	ask := func() *rlspb.RateLimitResponse {
		r, err := c.ShouldRateLimit(withToken(decisionToken), &rlspb.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("user", "zed")}})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	if r := ask(); r.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 3 {
		t.Fatalf("before: %v", r)
	}
	if err := os.WriteFile(path, []byte(strings.Replace(rlsYAML, "requests_per_unit: 3", "requests_per_unit: 30", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := awaitReload(t, s); err != nil {
		t.Fatalf("reload: %v", err)
	}
	if r := ask(); r.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 30 {
		t.Fatalf("after the edit: %v", r)
	}
	if err := os.WriteFile(path, []byte("domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: fortnight}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := awaitReload(t, s); err == nil || !strings.Contains(err.Error(), "rate_limit.unit") {
		t.Fatalf("a broken edit reloaded: %v", err)
	}
	if r := ask(); r.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 30 {
		t.Fatalf("after the broken edit: %v", r)
	}
}

// With Redis down the service's failure mode decides: fail_open answers OK
// and marks the request degraded upstream; fail_closed answers UNAVAILABLE
// (Envoy's failure_mode_deny then refuses with its status_on_error).
func TestRLSRedisDown(t *testing.T) {
	for _, mode := range []string{"fail_open", "fail_closed"} {
		t.Run(mode, func(t *testing.T) {
			// Windows of an hour (the tier) and a day (the YAML): none is likely to end between the calls below.
			toml := "[[tiers]]\nname = \"free\"\nlimit = 2\nwindow_seconds = 3600\nalgorithm = \"fixed_window\"\nper_endpoint = false\n"
			s, c, _ := rlsService(t, rlsYAML, toml, map[string]string{"TOLLGATE_FAILURE_MODE": mode})
			s.redis.Stop()
			r, err := c.ShouldRateLimit(withToken(decisionToken), &rlspb.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("daily", "u"), desc("health", "h")}})
			if mode == "fail_closed" {
				if status.Code(err) != codes.Unavailable {
					t.Fatalf("%v %v, want UNAVAILABLE", r, err)
				}
				return
			}
			if err != nil || r.OverallCode != rlspb.RateLimitResponse_OK || len(r.RequestHeadersToAdd) != 1 ||
				r.RequestHeadersToAdd[0].Key != "x-tollgate-decision" || r.RequestHeadersToAdd[0].Value != "degraded" {
				t.Fatalf("%v %v, want OK marked degraded", r, err)
			}
			m := s.do("GET", "/metrics", nil)
			if !strings.Contains(string(m.body), `tollgate_rls_decisions_total{code="degraded",domain="api"} 1`) {
				t.Fatal("the degraded answer is not counted")
			}
			// Failing open is not unlimited: this replica counts in memory,
			// the YAML's 3 a day and the tier's 2 alike.
			for i, want := range []rlspb.RateLimitResponse_Code{rlspb.RateLimitResponse_OK, rlspb.RateLimitResponse_OK, rlspb.RateLimitResponse_OVER_LIMIT} {
				r, err := c.ShouldRateLimit(withToken(decisionToken), &rlspb.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("daily", "u")}})
				if err != nil || r.OverallCode != want {
					t.Fatalf("YAML domain, call %d while Redis is down: %v %v, want %v", i+2, r, err, want)
				}
			}
			for i, want := range []rlspb.RateLimitResponse_Code{rlspb.RateLimitResponse_OK, rlspb.RateLimitResponse_OK, rlspb.RateLimitResponse_OVER_LIMIT} {
				r, err := c.ShouldRateLimit(withToken(decisionToken), &rlspb.RateLimitRequest{Domain: rls.TollgateDomain, Descriptors: []*ratelimitv3.RateLimitDescriptor{desc(rls.KeyRemoteAddress, "192.0.2.4")}})
				if err != nil || r.OverallCode != want {
					t.Fatalf("tollgate domain, call %d while Redis is down: %v %v, want %v", i+1, r, err, want)
				}
			}
		})
	}
}

// A long path is matched whole after it is normalised, never cut to a
// bounded value first: cut, "/auth/login;aaa...a" could lose the rule's
// segment. A path longer than the decision API takes is refused as that
// API refuses it, and so is a ';' parameter that more path follows
// ("/auth;aaa...a/login": Fastify reads "/auth", a servlet "/auth/login").
func TestRLSLongPathKeepsItsRule(t *testing.T) {
	toml := `
[[tiers]]
name = "free"
limit = 100
window_seconds = 60

[[rules]]
id = "login"
path = "/auth/login"
methods = ["POST"]
scope = "ip"
algorithm = "fixed_window"
limit = 2
window_seconds = 60
`
	_, c, _ := rlsService(t, rlsYAML, toml, nil)
	ctx := withToken(decisionToken)
	ask := func(addr, path string) *rlspb.RateLimitResponse {
		t.Helper()
		r, err := c.ShouldRateLimit(ctx, &rlspb.RateLimitRequest{Domain: rls.TollgateDomain,
			Descriptors: []*ratelimitv3.RateLimitDescriptor{desc(rls.KeyRemoteAddress, addr, rls.KeyPath, path, rls.KeyMethod, "POST")}})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	pad := strings.Repeat("a", 1100)
	for n, path := range []string{"/auth/login;" + pad, "/auth//login;" + pad} {
		addr := fmt.Sprintf("192.0.2.%d", 20+n) // a counter of its own
		for i := range 3 {
			r := ask(addr, path)
			if want := i == 2; (r.OverallCode == rlspb.RateLimitResponse_OVER_LIMIT) != want || r.Statuses[0].CurrentLimit.GetName() != "login" {
				t.Fatalf("%.30s..., call %d: %v, want the login rule's answer", path, i, r)
			}
		}
	}
	if r := ask("192.0.2.30", "/"+strings.Repeat("a", paths.MaxLen)); r.OverallCode != rlspb.RateLimitResponse_OVER_LIMIT || !hasHeader(r, "x-tollgate-refused") {
		t.Fatalf("a path past the decision API's bound: %v, want OVER_LIMIT with x-tollgate-refused", r)
	}
	// A path upstreams read two ways is refused, as the filter refuses it:
	// Envoy forwards it as sent unless its connection manager normalises.
	for _, path := range []string{"/" + pad + "/../auth/login", "/api/v1/items/7%2F..%2F..%2Fx", "/a/%2e%2e/auth/login", "/auth;" + pad + "/login", "/auth/login/;x"} {
		if r := ask("192.0.2.31", path); r.OverallCode != rlspb.RateLimitResponse_OVER_LIMIT || !hasHeader(r, "x-tollgate-refused") {
			t.Fatalf("%.30s...: %v, want OVER_LIMIT with x-tollgate-refused", path, r)
		}
	}
}

// A method override reaches the rate limit service as the filter reads it:
// tollgate.method_override entries (Envoy's request_headers actions on the
// override headers) and _method parameters of the path's query count the
// request under the method they name too; overrides that disagree are
// refused as input (OVER_LIMIT with x-tollgate-refused), never an error.
func TestRLSMethodOverride(t *testing.T) {
	toml := `
[[tiers]]
name = "free"
limit = 100
window_seconds = 60

[[rules]]
id = "deletes"
path = "/things/*"
methods = ["DELETE"]
scope = "ip"
algorithm = "fixed_window"
limit = 1
window_seconds = 60
`
	_, c, _ := rlsService(t, rlsYAML, toml, nil)
	ctx := withToken(decisionToken)
	ask := func(addr string, kv ...string) *rlspb.RateLimitResponse {
		t.Helper()
		r, err := c.ShouldRateLimit(ctx, &rlspb.RateLimitRequest{Domain: rls.TollgateDomain,
			Descriptors: []*ratelimitv3.RateLimitDescriptor{desc(append([]string{rls.KeyRemoteAddress, addr}, kv...)...)}})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	for n, override := range [][]string{
		{rls.KeyMethodOverride, "DELETE"},
		{rls.KeyMethodOverride, "delete"},                                          // read upper-cased, as frameworks read it
		{rls.KeyPath, "/things/1?_method=DELETE"},                                  // a query parameter
		{rls.KeyPath, "/things/1?a=1&%5Fmethod=delete"},                            // escaped
		{rls.KeyMethodOverride, "DELETE", rls.KeyMethodOverride, "delete"},         // two headers that agree
		{rls.KeyPath, "/things/1?_method=DELETE", rls.KeyMethodOverride, "DELETE"}, // a header and a parameter that agree
	} {
		addr := fmt.Sprintf("192.0.2.%d", 40+n)
		kv := append([]string{rls.KeyMethod, "POST"}, override...)
		if !slices.Contains(kv, rls.KeyPath) {
			kv = append(kv, rls.KeyPath, "/things/1")
		}
		for i := range 2 {
			r := ask(addr, kv...)
			if want := i == 1; (r.OverallCode == rlspb.RateLimitResponse_OVER_LIMIT) != want || r.Statuses[0].CurrentLimit.GetName() != "deletes" {
				t.Fatalf("%v, call %d: %v, want the DELETE rule's answer", override, i, r)
			}
		}
	}
	for _, kv := range [][]string{
		{rls.KeyPath, "/things/1", rls.KeyMethodOverride, "DELETE", rls.KeyMethodOverride, "PUT"},
		{rls.KeyPath, "/things/1?_method=PUT", rls.KeyMethodOverride, "DELETE"},
		{rls.KeyPath, "/things/1", rls.KeyMethodOverride, "not a method"},
	} {
		if r := ask("192.0.2.60", append([]string{rls.KeyMethod, "POST"}, kv...)...); r.OverallCode != rlspb.RateLimitResponse_OVER_LIMIT || !hasHeader(r, "x-tollgate-refused") {
			t.Errorf("%v: %v, want OVER_LIMIT with x-tollgate-refused", kv, r)
		}
	}
	// The request's own method named again is no override.
	if r := ask("192.0.2.61", rls.KeyMethod, "POST", rls.KeyPath, "/things/1", rls.KeyMethodOverride, "post"); r.OverallCode != rlspb.RateLimitResponse_OK || r.Statuses[0].CurrentLimit.GetName() == "deletes" {
		t.Fatalf("POST overridden as POST: %v", r)
	}
}

// A gRPC connection that makes no authorized call within its probation is
// closed (grpc-go would keep an idle one for 5 minutes: a preface alone
// held a connection); one that made an authorized call stays.
func TestRLSConnectionsWithoutACallClose(t *testing.T) {
	defer app.SetGRPCProbation(300 * time.Millisecond)()
	s, c, _ := rlsService(t, rlsYAML, "", nil)
	// The HTTP/2 preface and an empty SETTINGS frame, then nothing.
	raw := rawHTTP2(t, s)
	ctx := withToken(decisionToken)
	req := &rlspb.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("user", "probation")}}
	if _, err := c.ShouldRateLimit(ctx, req); err != nil {
		t.Fatal(err)
	}
	raw.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.Copy(io.Discard, raw); err != nil {
		t.Fatalf("the idle connection: %v, want closed", err)
	}
	time.Sleep(400 * time.Millisecond) // past the client connection's probation too
	if _, err := c.ShouldRateLimit(ctx, req); err != nil {
		t.Fatal(err)
	}
	got := metricValue(t, s, `tollgate_connections_refused_total{listener="grpc"}`)
	if got != 1 {
		t.Fatalf("%v gRPC connections closed, want 1 (the one without a call)", got)
	}
}

// A call that begins its message and never finishes it is ended after the
// call deadline (grpc-go reads it with none: an outsider holding the token
// held 2 MiB on each of 2,048 such calls). Raw HTTP/2 frames: no client
// library sends half a message.
func TestRLSUnfinishedMessageEnds(t *testing.T) {
	defer app.SetGRPCCallDeadline(300 * time.Millisecond)()
	s, _, _ := rlsService(t, rlsYAML, "", nil)
	raw := rawHTTP2(t, s)
	frame := func(typ, flags byte, stream uint32, payload []byte) []byte {
		n := len(payload)
		return append([]byte{byte(n >> 16), byte(n >> 8), byte(n), typ, flags, byte(stream >> 24), byte(stream >> 16), byte(stream >> 8), byte(stream)}, payload...)
	}
	// HPACK literal fields without indexing, lengths under 127.
	var block []byte
	for _, kv := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"},
		{":authority", "x"}, {"content-type", "application/grpc"}, {"te", "trailers"}, {"authorization", "Bearer " + decisionToken}} {
		block = append(append(append(block, 0, byte(len(kv[0]))), kv[0]...), byte(len(kv[1])))
		block = append(block, kv[1]...)
	}
	out := frame(0x1, 0x4, 1, block)                                // HEADERS, END_HEADERS
	msg := append([]byte{0, 0, 0, 0x03, 0xe8}, make([]byte, 10)...) // a 1,000-byte message, 10 bytes of it
	out = append(out, frame(0x0, 0, 1, msg)...)                     // DATA, no END_STREAM
	if _, err := raw.Write(out); err != nil {
		t.Fatal(err)
	}
	raw.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(raw)
	for {
		var h [9]byte
		if _, err := io.ReadFull(br, h[:]); err != nil {
			t.Fatalf("the unfinished call was not ended: %v", err)
		}
		n, typ, flags, stream := int(h[0])<<16|int(h[1])<<8|int(h[2]), h[3], h[4], binary.BigEndian.Uint32(h[5:])&0x7fffffff
		if _, err := io.CopyN(io.Discard, br, int64(n)); err != nil {
			t.Fatal(err)
		}
		if stream == 1 && (typ == 0x3 || typ == 0x1 && flags&0x1 != 0) { // RST_STREAM, or trailers ending it
			return
		}
	}
}

// rawHTTP2 is a TCP connection to s's gRPC listener that has sent the
// HTTP/2 client preface and an empty SETTINGS frame, closed with the test.
func rawHTTP2(t *testing.T, s *service) net.Conn {
	t.Helper()
	raw, err := net.Dial("tcp", s.app.GRPCAddr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { raw.Close() })
	if _, err := raw.Write([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")); err != nil {
		t.Fatal(err)
	}
	return raw
}

// Rate limiting off (enabled = false) or only watched (shadow_mode), the
// tollgate domain still refuses what the decision API refuses for its API
// key: keys are access control (an outsider's keyless and forged-key calls
// were answered OK in both modes).
func TestRLSKeysHoldWhenLimitingIsOff(t *testing.T) {
	toml := "api_key_required_paths = [\"/secure/**\"]\n[[tiers]]\nname = \"free\"\nlimit = 1\nwindow_seconds = 60\nper_endpoint = false\n"
	for _, env := range []map[string]string{{"TOLLGATE_ENABLED": "false"}, {"TOLLGATE_SHADOW_MODE": "true"}} {
		_, c, _ := rlsService(t, rlsYAML, toml, env)
		ask := func(d *ratelimitv3.RateLimitDescriptor) *rlspb.RateLimitResponse {
			r, err := c.ShouldRateLimit(withToken(decisionToken), &rlspb.RateLimitRequest{Domain: rls.TollgateDomain, Descriptors: []*ratelimitv3.RateLimitDescriptor{d}})
			if err != nil {
				t.Fatalf("%v: %v", env, err)
			}
			return r
		}
		for _, d := range []*ratelimitv3.RateLimitDescriptor{
			desc(rls.KeyRemoteAddress, "192.0.2.20", rls.KeyPath, "/secure/x"),
			desc(rls.KeyRemoteAddress, "192.0.2.20", rls.KeyPath, "/secure/x", rls.KeyAPIKey, "ak_live_"+strings.Repeat("x", 43)),
			desc(rls.KeyRemoteAddress, "192.0.2.20", rls.KeyPath, "/secure/x", rls.KeyAPIKey, "malformed"),
		} {
			if r := ask(d); r.OverallCode != rlspb.RateLimitResponse_OVER_LIMIT || !hasHeader(r, "x-tollgate-refused") {
				t.Errorf("%v, %v: %v; want OVER_LIMIT with x-tollgate-refused", env, d, r)
			}
		}
		// Past its limit the caller is admitted all the same: nothing is
		// limited in either mode.
		for i := 0; i < 3; i++ {
			if r := ask(desc(rls.KeyRemoteAddress, "192.0.2.21", rls.KeyPath, "/open")); r.OverallCode != rlspb.RateLimitResponse_OK {
				t.Errorf("%v, call %d of a limit of 1: %v", env, i, r)
			}
		}
	}
}

// A rule whose cost the response reports (an LLM token budget) spends, in
// the tollgate domain, what an unreported response costs, at admission:
// Envoy's rate limit filter reports no response, and no charge follows.
// Before, each check spent one token: an outsider's 1,000 answers went
// through a 1,500-token budget that the filter held at 4.
func TestRLSResponseCostSpentAtAdmission(t *testing.T) {
	_, c, _ := rlsService(t, rlsYAML, tokenRules, nil) // tokens: 1,000 an hour, 300 an unreported answer
	ctx := withToken(decisionToken)
	ok := 0
	for range 10 {
		r, err := c.ShouldRateLimit(ctx, &rlspb.RateLimitRequest{Domain: rls.TollgateDomain,
			Descriptors: []*ratelimitv3.RateLimitDescriptor{desc(rls.KeyUser, "rls-llm", rls.KeyPath, "/v1/chat/completions", rls.KeyMethod, "POST")}})
		if err != nil {
			t.Fatal(err)
		}
		if r.OverallCode == rlspb.RateLimitResponse_OK {
			ok++
		} else if name := r.Statuses[0].GetCurrentLimit().GetName(); name != "tokens" {
			t.Fatalf("refused by %q, want the token budget", name)
		}
	}
	if ok != 3 {
		t.Fatalf("%d of 10 admitted through the gRPC service, want 3 (1,000 tokens, 300 an answer)", ok)
	}
}

// Without the decision token a signed-in user's descriptor (remote_address
// and tollgate.user) is decided as the user, not refused: only the
// credential may name an address beside another identity, and an
// outsider's token-less service answered every signed-in user 429.
func TestRLSUntrustedSignedInUser(t *testing.T) {
	_, c, _ := rlsService(t, rlsYAML, "", map[string]string{"TOLLGATE_DECISION_TOKEN": ""})
	r, err := c.ShouldRateLimit(context.Background(), &rlspb.RateLimitRequest{Domain: rls.TollgateDomain,
		Descriptors: []*ratelimitv3.RateLimitDescriptor{desc(rls.KeyRemoteAddress, "192.0.2.61", rls.KeyUser, "signed-in", rls.KeyPath, "/api/v1/items", rls.KeyMethod, "GET")}})
	if err != nil {
		t.Fatal(err)
	}
	if r.OverallCode != rlspb.RateLimitResponse_OK || hasHeader(r, "x-tollgate-refused") {
		t.Fatalf("a signed-in user through a token-less service: %v, want OK", r)
	}
}
