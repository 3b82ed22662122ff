package wasmhost

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// Timers: a plugin that asks for a tick period gets proxy_on_tick each time
// the host ticks it.
func TestTicks(t *testing.T) {
	out := filepath.Join(t.TempDir(), "tick.wasm")
	cmd := exec.Command("go", "build", "-buildmode=c-shared", "-o", out, "./testdata/tickplugin")
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build the tick plugin: %v\n%s", err, b)
	}
	wasm, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	h, err := New(ctx, wasm, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close(ctx)
	vm, err := h.NewVM(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if vm.TickPeriod() != 250*time.Millisecond {
		t.Fatalf("tick period %v, want 250ms", vm.TickPeriod())
	}
	for i := 0; i < 3; i++ {
		if err := vm.Tick(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if got := h.Counter("ticks"); got != 3 {
		t.Fatalf("%d ticks seen by the plugin, want 3", got)
	}
}
