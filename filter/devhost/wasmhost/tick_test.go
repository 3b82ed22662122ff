package wasmhost

import (
	"context"
	"testing"
	"time"
)

// Timers: a plugin that asks for a tick period gets proxy_on_tick each time
// the host ticks it.
func TestTicks(t *testing.T) {
	ctx := context.Background()
	h, vm := tickVM(t)
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

// A closed VM's memory is unmapped: every later call answers an error and
// none reaches the guest (the gateway closes a VM it replaces while its
// streams are still in flight).
func TestClosedVMRefusesCalls(t *testing.T) {
	ctx := context.Background()
	_, vm := tickVM(t)
	if err := vm.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := vm.Tick(ctx); err == nil {
		t.Fatal("a tick reached a closed VM")
	}
	if _, err := vm.NewStream(ctx, Headers{{":method", "GET"}, {":path", "/"}, {":authority", "a"}}, nil); err == nil {
		t.Fatal("a stream opened on a closed VM")
	}
	if vm.Broken() == nil {
		t.Fatal("a closed VM reports no error")
	}
}

// tickVM is a host of the tick plugin (testdata/tickplugin) and a VM of it.
func tickVM(t *testing.T) (*Host, *VM) {
	t.Helper()
	ctx := context.Background()
	h, err := New(ctx, buildTestPlugin(t, "tickplugin"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close(ctx) })
	vm, err := h.NewVM(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return h, vm
}
