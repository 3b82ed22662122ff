// Package filtertest drives the compiled tollgate.wasm under wasmhost: every
// behaviour test here runs the real module, built fresh by TestMain.
package filtertest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/tetratelabs/wazero"
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
	if wasmBytes, err = os.ReadFile(out); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	compCache.Close(context.Background())
	os.RemoveAll(dir)
	os.Exit(code)
}

// The module exports what Envoy calls and nothing it would call for
// nothing: no body or log callbacks (each would cost a VM call per chunk or
// per request). The one export Envoy never calls is tollgate_debug_allocs: a
// read of the Go heap's allocation count for the benchmarks (guest
// allocations per request), inert unless called.
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
		"proxy_on_done", "proxy_on_http_call_response", "proxy_on_memory_allocate", "proxy_on_request_headers",
		"proxy_on_response_headers", "proxy_on_tick", "proxy_on_vm_start", "tollgate_debug_allocs"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("exports %v\nwant    %v", got, want)
	}
}
