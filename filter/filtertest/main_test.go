// Package filtertest drives the compiled tollgate.wasm under wasmhost: every
// behaviour test here runs the real module, built fresh by TestMain.
package filtertest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
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
