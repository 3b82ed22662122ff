package gateway

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
)

// A -cluster flag either names an http(s) upstream with a host, or is
// refused with the value quoted; it never panics.
func FuzzParseCluster(f *testing.F) {
	for _, s := range []string{"controlsvc=http://127.0.0.1:8081", "a=https://svc", "=http://x", "a=ftp://x", "a=http://", "a=http://[::1", "a=http://h:port", "noequals"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		name, u, err := ParseCluster(s)
		if err != nil {
			if !strings.Contains(err.Error(), "cluster ") {
				t.Fatalf("%q: error %q names no cluster", s, err)
			}
			return
		}
		if name == "" || strings.Contains(name, "=") || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			t.Fatalf("%q accepted as %q %v", s, name, u)
		}
	})
}

// Without the filter the gateway still does Envoy's own work on a request:
// the benchmark's baseline is Envoy without the filter.
func TestNoFilterIsEnvoyWithoutTheFilter(t *testing.T) {
	seen := make(chan http.Header, 8) // room for what a broken gateway lets through
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { seen <- r.Header.Clone() }))
	defer up.Close()
	u, _ := url.Parse(up.URL)
	g, err := New(context.Background(), Config{Upstream: u, NoFilter: true})
	if err != nil {
		t.Fatal(err)
	}
	gw := httptest.NewServer(g)
	defer gw.Close()

	req, _ := http.NewRequest("GET", gw.URL+"/a", nil)
	req.Header.Set("X-Request-Id", "the-client's")
	req.Header.Set("X-Forwarded-For", "203.0.113.9")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	h := <-seen
	if id := h.Get("X-Request-Id"); len(id) != 36 || id == "the-client's" {
		t.Errorf("x-request-id upstream: %q, want a new UUID", id)
	}
	if xff := h.Get("X-Forwarded-For"); xff != "203.0.113.9, 127.0.0.1" {
		t.Errorf("X-Forwarded-For upstream: %q, want the peer appended", xff)
	}

	many, _ := http.NewRequest("GET", gw.URL+"/a", nil)
	for i := range maxRequestHeaders + 1 {
		many.Header.Set("X-H"+strconv.Itoa(i), "v")
	}
	upgrade, _ := http.NewRequest("GET", gw.URL+"/a", nil)
	upgrade.Header.Set("Connection", "Upgrade")
	upgrade.Header.Set("Upgrade", "websocket")
	for _, tc := range []struct {
		name string
		req  *http.Request
		want int
	}{{"too many headers", many, 431}, {"an upgrade", upgrade, 403}} {
		resp, err := http.DefaultClient.Do(tc.req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, resp.StatusCode, tc.want)
		}
	}
	select {
	case h := <-seen:
		t.Errorf("a refused request reached the upstream: %v", h)
	default:
	}
}
