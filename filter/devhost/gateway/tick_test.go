package gateway

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// A VM that asks for a shorter tick period is ticked on the new period at
// once, as Envoy's setTickPeriod re-arms its timer: the filter ticks every
// 200 ms while it keeps leases and asks for 1 ms while requests wait for a
// refill, and a loop that slept out the old period first held those
// requests up to 92 ms at p99. The test plugin asks for a tick an hour at
// start and for one a millisecond when a request comes: without the
// re-arm no tick would come for an hour.
func TestNewTickPeriodRearmsAtOnce(t *testing.T) {
	wasm := buildTickPlugin(t)
	up := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer up.Close()
	u, _ := url.Parse(up.URL)
	ctx := context.Background()
	g, err := New(ctx, Config{Wasm: wasm, PluginConfig: []byte("rearm"), Upstream: u})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close(ctx)
	gw := httptest.NewServer(g)
	defer gw.Close()
	resp, err := http.Get(gw.URL + "/a")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	// Await the plugin's tick counter; the deadline only bounds a failing
	// run.
	for deadline := time.Now().Add(30 * time.Second); g.Host().Counter("ticks") == 0; {
		if time.Now().After(deadline) {
			t.Fatal("no tick in 30 s after the VM asked for one every millisecond (the loop still waits out the hour)")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// buildTickPlugin compiles wasmhost's tick test module for wasip1.
func buildTickPlugin(t *testing.T) []byte {
	t.Helper()
	out := filepath.Join(t.TempDir(), "tickplugin.wasm")
	cmd := exec.Command("go", "build", "-buildmode=c-shared", "-o", out, "../wasmhost/testdata/tickplugin")
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build the tick plugin: %v\n%s", err, b)
	}
	wasm, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return wasm
}
