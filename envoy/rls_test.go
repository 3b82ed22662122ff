package envoy

import (
	"os"
	"slices"
	"strings"
	"testing"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	headermutationv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/header_mutation/v3"
	luav3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/lua/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	httpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"sigs.k8s.io/yaml"

	"github.com/tollgate-rl/tollgate/testkit/redistest"
)

// Descriptor keys the control service's tollgate domain reads
// (controlsvc/internal/rls: KeyRemoteAddress and the tollgate.* keys).
var tollgateKeys = []string{"remote_address", "tollgate.user", "tollgate.api_key", "tollgate.path", "tollgate.method", "tollgate.method_override", "tollgate.tier", "tollgate.tenant"}

// envoy-rls.yaml: Envoy's ratelimit filter asking Tollgate over gRPC,
// checked against Envoy's protos and against what the service reads.
func TestRateLimitServiceBootstrap(t *testing.T) {
	b := load(t, "envoy-rls.yaml")
	clusters := map[string]bool{}
	for _, c := range b.GetStaticResources().GetClusters() {
		clusters[c.GetName()] = true
		if c.GetName() == "tollgate_rls" {
			opts := &httpv3.HttpProtocolOptions{}
			if err := c.GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"].UnmarshalTo(opts); err != nil ||
				opts.GetExplicitHttpConfig().GetHttp2ProtocolOptions() == nil {
				t.Fatalf("the gRPC cluster does not speak HTTP/2: %v", err)
			}
		}
	}
	hcm, ok := validateAny(t, "hcm", b.GetStaticResources().GetListeners()[0].GetFilterChains()[0].GetFilters()[0].GetTypedConfig()).(*hcmv3.HttpConnectionManager)
	if !ok {
		t.Fatal("no http_connection_manager")
	}
	checkTrustBoundary(t, hcm)
	var names []string
	var rl *ratelimitv3.RateLimit
	for _, hf := range hcm.GetHttpFilters() {
		names = append(names, hf.GetName())
		if m, ok := validateAny(t, hf.GetName(), hf.GetTypedConfig()).(*ratelimitv3.RateLimit); ok {
			rl = m
		}
	}
	if want := []string{"envoy.filters.http.header_mutation", "envoy.filters.http.lua", "envoy.filters.http.ratelimit", "envoy.filters.http.router"}; !slices.Equal(names, want) {
		t.Fatalf("http filters %v, want %v", names, want)
	}
	checkRepeatsRefused(t, validateAny(t, "lua", hcm.GetHttpFilters()[1].GetTypedConfig()).(*luav3.Lua), hcm)
	// A client's x-tollgate-* headers are removed before anything reads them.
	hm := validateAny(t, "header_mutation", hcm.GetHttpFilters()[0].GetTypedConfig()).(*headermutationv3.HeaderMutation)
	var removed []string
	for _, m := range hm.GetMutations().GetRequestMutations() {
		removed = append(removed, m.GetRemove())
	}
	for _, h := range []string{"x-tollgate-identity", "x-tollgate-tier", "x-tollgate-decision"} {
		if !slices.Contains(removed, h) {
			t.Errorf("a client's %s reaches the upstream (removed: %v)", h, removed)
		}
	}
	gs := rl.GetRateLimitService().GetGrpcService()
	if !clusters[gs.GetEnvoyGrpc().GetClusterName()] || gs.GetEnvoyGrpc().GetClusterName() != "tollgate_rls" {
		t.Fatalf("the rate limit service cluster %q is not defined", gs.GetEnvoyGrpc().GetClusterName())
	}
	if md := gs.GetInitialMetadata(); len(md) != 1 || md[0].GetKey() != "authorization" || !strings.HasPrefix(md[0].GetValue(), "Bearer ") {
		t.Fatalf("the decision token is not sent as authorization metadata: %v", md)
	}
	if !rl.GetFailureModeDeny() || rl.GetDomain() != "tollgate" {
		t.Fatalf("failure_mode_deny %v, domain %q: an unreachable service must not let traffic through unlimited", rl.GetFailureModeDeny(), rl.GetDomain())
	}
	// Every route asks the service: the virtual host's tollgate actions
	// apply wherever a route has none of its own (a prefix route of its
	// own left every other path, /API/... and /api;x/... among them,
	// unchecked), and a route with its own names its domain.
	exampleDomain := exampleRLSDomain(t)
	own := 0
	for _, vh := range hcm.GetRouteConfig().GetVirtualHosts() {
		if len(vh.GetRateLimits()) == 0 {
			t.Fatalf("virtual host %q has no tollgate rate limits: a route without its own is unchecked", vh.GetName())
		}
		for _, lim := range vh.GetRateLimits() {
			checkActions(t, rl.GetDomain(), exampleDomain, lim.GetActions())
		}
		for _, r := range vh.GetRoutes() {
			if !clusters[r.GetRoute().GetCluster()] {
				t.Fatalf("route to undefined cluster %q", r.GetRoute().GetCluster())
			}
			domain := rl.GetDomain()
			if pr := r.GetTypedPerFilterConfig()["envoy.filters.http.ratelimit"]; pr != nil {
				m := validateAny(t, "per-route", pr).(*ratelimitv3.RateLimitPerRoute)
				domain = m.GetDomain()
				if m.GetVhRateLimits() == ratelimitv3.RateLimitPerRoute_IGNORE {
					t.Fatalf("route %v ignores the virtual host's rate limits", r.GetMatch())
				}
			}
			if len(r.GetRoute().GetRateLimits()) == 0 {
				continue
			}
			own++
			// Its own limits replace the virtual host's: a plain prefix
			// ("/search") took every path that starts so ("/searchadmin")
			// out of the tollgate domain (an outsider's reading).
			if p := r.GetMatch().GetPrefix(); p != "" && !strings.HasSuffix(p, "/") {
				t.Fatalf("route %v has limits of its own behind a plain prefix: match with path_separated_prefix", r.GetMatch())
			}
			for _, lim := range r.GetRoute().GetRateLimits() {
				checkActions(t, domain, exampleDomain, lim.GetActions())
			}
		}
	}
	if own != 1 {
		t.Fatalf("%d routes have rate limits of their own, want 1 (the example domain's)", own)
	}
}

// checkRepeatsRefused: the Lua filter before the rate limit filter
// refuses a request repeating any header a tollgate descriptor reads by
// name (Envoy's request_headers action passes the first of them only), and
// its code compiles: Redis's Lua is 5.1, as Envoy's LuaJIT is, and SCRIPT
// LOAD compiles without running.
func checkRepeatsRefused(t *testing.T, lua *luav3.Lua, hcm *hcmv3.HttpConnectionManager) {
	t.Helper()
	code := lua.GetDefaultSourceCode().GetInlineString()
	if !strings.Contains(code, "getNumValues(name) > 1") || !strings.Contains(code, "handle:respond") {
		t.Fatalf("the Lua filter does not refuse repeated headers:\n%s", code)
	}
	for _, vh := range hcm.GetRouteConfig().GetVirtualHosts() {
		for _, lim := range vh.GetRateLimits() {
			for _, a := range lim.GetActions() {
				if h := a.GetRequestHeaders().GetHeaderName(); h != "" && !strings.HasPrefix(h, ":") && !strings.Contains(code, `"`+h+`"`) {
					t.Errorf("descriptor header %s may be repeated: the Lua filter does not refuse it", h)
				}
			}
		}
	}
	if _, err := redistest.Do(redistest.Start(t).Addr, "SCRIPT", "LOAD", code); err != nil {
		t.Fatalf("the Lua filter's code does not compile: %v", err)
	}
}

// checkActions: a tollgate-domain descriptor holds only keys the service
// reads, and names a caller; another domain is the example config's.
func checkActions(t *testing.T, domain, exampleDomain string, actions []*routev3.RateLimit_Action) {
	t.Helper()
	if domain != "tollgate" {
		if domain != exampleDomain {
			t.Fatalf("route domain %q is neither tollgate nor the example config's %q", domain, exampleDomain)
		}
		return
	}
	caller := false
	for _, a := range actions {
		switch {
		case a.GetRemoteAddress() != nil:
			caller = true
		case a.GetRequestHeaders() != nil:
			if k := a.GetRequestHeaders().GetDescriptorKey(); !slices.Contains(tollgateKeys, k) {
				t.Fatalf("descriptor key %q is not one the tollgate domain reads", k)
			}
		default:
			t.Fatalf("action %v: the tollgate domain reads remote_address and request headers", a)
		}
	}
	if !caller {
		t.Fatal("a tollgate descriptor without remote_address names no caller")
	}
}

func exampleRLSDomain(t *testing.T) string {
	t.Helper()
	raw, err := os.ReadFile("rls-config.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		Domain string `json:"domain"`
	}
	if err := yaml.Unmarshal(raw, &c); err != nil || c.Domain == "" {
		t.Fatalf("rls-config.example.yaml: %v", err)
	}
	return c.Domain
}
