package wasmhost

import (
	"context"
	"testing"
	"time"
)

// Timers: a plugin that asks for a tick period gets proxy_on_tick each time
// the host ticks it.
func TestTicks(t *testing.T) {
	wasm := buildTestPlugin(t, "tickplugin")
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
