// Package filtertest drives the compiled tollgate.wasm under wasmhost: every
// behaviour test here runs the real module, built fresh by TestMain.
package filtertest

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/tetratelabs/wazero"

	"github.com/tollgate-rl/tollgate/filter/devhost/wasmhost"
)

var (
	wasmBytes []byte
	compCache = wazero.NewCompilationCache()
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "tollgate-wasm")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	out := filepath.Join(dir, "tollgate.wasm")
	cmd := exec.Command("go", "build", "-buildmode=c-shared", "-o", out, "..")
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build the filter for wasip1:", err)
		os.Exit(1)
	}
	if alt := os.Getenv("TOLLGATE_BENCH_WASM"); alt != "" {
		out = alt // another build, for a side-by-side benchmark
	}
	if wasmBytes, err = os.ReadFile(out); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// The behaviour suite runs once under each WASI a supported Envoy gives
	// (1.33-1.38, whose poll_oneoff fails, and 1.39 on); benchmarks once,
	// under the stricter one.
	flag.Parse()
	modes := []wasmhost.WASI{wasmhost.WASIEnvoy, wasmhost.WASIEnvoyNewer}
	if f := flag.Lookup("test.bench"); f != nil && f.Value.String() != "" {
		modes = modes[:1]
	}
	code := 0
	for _, mode := range modes {
		envoyWASI = mode
		fmt.Fprintf(os.Stderr, "filtertest: the suite under %v\n", mode)
		if c := m.Run(); c != 0 {
			code = c
		}
	}
	compCache.Close(context.Background())
	os.RemoveAll(dir)
	os.Exit(code)
}

// The module exports what Envoy calls and nothing it would call for
// nothing: no log callback, and no done callback (a VM call per request
// each; without proxy_on_done a context is done at once, as the plugin's
// always were: 4-5 % of a lease hit). The body callbacks read
// the cost a response reports (LLM tokens) and a form body's method
// override; other streams return from them at once. The two exports Envoy never calls are tollgate_debug_allocs
// and tollgate_debug_gc_cycles: reads of the Go heap's allocation count and
// of its garbage collections, for benchmarks and soaks, inert unless called.
func TestModuleExports(t *testing.T) {
	ctx := context.Background()
	rt := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfig().WithCompilationCache(compCache))
	defer rt.Close(ctx)
	m, err := rt.CompileModule(ctx, wasmBytes)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for name := range m.ExportedFunctions() {
		got = append(got, name)
	}
	sort.Strings(got)
	want := []string{"_initialize", "proxy_abi_version_0_2_1", "proxy_on_configure", "proxy_on_context_create", "proxy_on_delete",
		"proxy_on_http_call_response", "proxy_on_memory_allocate", "proxy_on_request_body", "proxy_on_request_headers",
		"proxy_on_response_body", "proxy_on_response_headers", "proxy_on_tick", "proxy_on_vm_start", "tollgate_debug_allocs", "tollgate_debug_gc_cycles"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("exports %v\nwant    %v", got, want)
	}
}
