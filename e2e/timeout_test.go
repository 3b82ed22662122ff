package e2e

import (
	"context"
	"io"
	"log/slog"
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

// A callout answered after the gateway closed its VMs is delivered to a
// closed VM, which refuses it: until 2026-11-26 the answer ran the guest in
// memory already unmapped, and the process died of a fault.
func TestCalloutAnsweredAfterClose(t *testing.T) {
	asked, release := make(chan struct{}), make(chan struct{})
	ctl := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(asked)
		<-release
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"allowed":true,"limit":10,"remaining":9,"reset_at":1,"window_seconds":60,"rule_id":"tier_free","lease":{"granted":0,"ttl_ms":0}}`)
	}))
	defer ctl.Close()
	up := newUpstream(t)
	upURL, _ := url.Parse(up.URL)
	ctlURL, _ := url.Parse(ctl.URL)
	logs := &records{warned: make(chan string, 8)}
	g, err := gateway.New(context.Background(), gateway.Config{
		Wasm: wasmBytes, Upstream: upURL, Clusters: map[string]*url.URL{"controlsvc": ctlURL}, VMs: 1, CompilationCache: compCache,
		PluginConfig: []byte(`{"control_cluster":"controlsvc","timeout_ms":5000,"lease":{"request":0}}`), Log: slog.New(logs),
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(g)
	go func() { _, _ = http.Get(srv.URL + "/x") }() // its answer never comes: the gateway closes first
	<-asked
	if err := g.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	close(release)
	// The answer's delivery fails and is logged; the process lives on.
	if msg := <-logs.warned; !strings.Contains(msg, "deliver a callout answer") {
		t.Fatalf("warned %q", msg)
	}
	srv.CloseClientConnections()
	srv.Close()
}

// records is a slog handler that hands over each warning's message and
// error.
type records struct{ warned chan string }

func (r *records) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (r *records) Handle(_ context.Context, rec slog.Record) error {
	msg := rec.Message
	rec.Attrs(func(a slog.Attr) bool { msg += " " + a.String(); return true })
	r.warned <- msg
	return nil
}
func (r *records) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *records) WithGroup(string) slog.Handler      { return r }

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
