package e2e

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/tollgate-rl/tollgate/filter/devhost/gateway"
)

// A control service that accepts and never answers: the gateway ends the
// callout at the filter's timeout_ms with the 504 Envoy would generate, and
// the filter applies its failure mode.
func TestCalloutTimeout(t *testing.T) {
	release := make(chan struct{})
	hung := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(func() { close(release); hung.Close() })
	up := newUpstream(t)
	for _, tt := range []struct {
		mode   string
		status int
	}{{"fail_open", 200}, {"fail_closed", 503}} {
		t.Run(tt.mode, func(t *testing.T) {
			upURL, _ := url.Parse(up.URL)
			ctlURL, _ := url.Parse(hung.URL)
			g, err := gateway.New(context.Background(), gateway.Config{
				Wasm: wasmBytes, Upstream: upURL, Clusters: map[string]*url.URL{"controlsvc": ctlURL}, VMs: 1, CompilationCache: compCache,
				PluginConfig: []byte(`{"control_cluster":"controlsvc","failure_mode":"` + tt.mode + `","timeout_ms":100,"lease":{"request":0}}`),
			})
			if err != nil {
				t.Fatal(err)
			}
			srv := httptest.NewServer(g)
			defer func() { srv.Close(); g.Close(context.Background()) }()
			res := get(t, srv.URL, "/x")
			if res.status != tt.status {
				t.Fatalf("%d %s", res.status, res.body)
			}
			if tt.mode == "fail_open" && up.last(t).Get("X-Tollgate-Decision") != "degraded" {
				t.Fatalf("upstream decision %q", up.last(t).Get("X-Tollgate-Decision"))
			}
			if tt.mode == "fail_closed" && !strings.Contains(string(res.body), "SERVICE_UNAVAILABLE") {
				t.Fatalf("body %s", res.body)
			}
			if n := g.Host().Counter("tollgate_callout_failures_total"); n != 1 {
				t.Fatalf("callout failures %d", n)
			}
		})
	}
}

func TestParseCluster(t *testing.T) {
	for in, ok := range map[string]bool{
		"controlsvc=http://127.0.0.1:8081": true,
		"a=https://localhost":              true,
		"noequals":                         false,
		"=http://x":                        false,
		"a=ftp://x":                        false,
		"a=http://":                        false,
	} {
		if _, _, err := gateway.ParseCluster(in); (err == nil) != ok {
			t.Errorf("%q: %v", in, err)
		}
	}
}
