package wasmhost

import (
	"context"
	"github.com/tollgate-rl/tollgate/filter/proxywasm/hostmodel"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tollgate-rl/tollgate/filter/proxywasm/abi"
)

// buildTestPlugin compiles a module of testdata for wasip1.
func buildTestPlugin(t *testing.T, name string) []byte {
	t.Helper()
	out := filepath.Join(t.TempDir(), name+".wasm")
	cmd := exec.Command("go", "build", "-buildmode=c-shared", "-o", out, "./testdata/"+name)
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v\n%s", name, err, b)
	}
	wasm, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return wasm
}

// A module whose runtime needs the poller dies under Envoy 1.33-1.38's WASI
// (poll_oneoff answers ENOSYS), and lives under the newer one and under
// wazero's full WASI. This is the failure the Envoy mode exists to show.
func TestPollOneoffUnderEnvoyWASI(t *testing.T) {
	wasm := buildTestPlugin(t, "tickplugin")
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		wasi  WASI
		fatal bool
	}{
		{"full", WASIFull, false},
		{"envoy 1.33-1.38", WASIEnvoy, true},
		{"envoy newer", WASIEnvoyNewer, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out strings.Builder
			h, err := New(ctx, wasm, Options{WASI: tc.wasi, Output: &out, PluginConfig: []byte("sleep")})
			if err != nil {
				t.Fatal(err)
			}
			defer h.Close(ctx)
			vm, err := h.NewVM(ctx)
			if err != nil {
				t.Fatalf("new VM: %v", err)
			}
			err = vm.Tick(ctx)
			if tc.fatal {
				if err == nil || vm.Broken() == nil {
					t.Fatalf("tick: %v; want the VM dead of poll_oneoff's ENOSYS", err)
				}
				if vm.HostCalls("poll_oneoff") == 0 {
					t.Fatal("poll_oneoff was not called")
				}
				return
			}
			if err != nil || h.Counter("ticks") != 1 {
				t.Fatalf("tick: %v, ticks %d (output %s)", err, h.Counter("ticks"), out.String())
			}
		})
	}
}

// The allow-lists: a call Envoy refuses while the VM allocates memory for the
// host traps the VM, as V8 does in Envoy.
func TestRestrictedCallTraps(t *testing.T) {
	h := &Host{opts: Options{WASI: WASIEnvoy}}
	vm := &VM{host: h, phase: phaseAlloc}
	func() {
		defer func() {
			if r := recover(); r == nil || !strings.Contains(r.(string), "proxy_get_property during memory allocation") {
				t.Fatalf("recovered %v", r)
			}
		}()
		vm.restricted("proxy_get_property")
	}()
	vm.restricted("proxy_log") // allowed: no panic
	vm.phase = phaseInit
	vm.restricted("fd_fdstat_set_flags") // Go's runtime calls it in _initialize; allowed
	if got := vm.Violations(); len(got) != 1 {
		t.Fatalf("violations %v", got)
	}
	h.opts.WASI = WASIEnvoyNewer
	vm.phase = phaseAlloc
	vm.restricted("poll_oneoff") // the newer host allows the GC's sleep during allocation
}

// After a request went on (Continue, or proxy_continue_stream), Envoy has
// released its headers: writing them is BadArgument, reading the response's
// is still fine.
func TestRequestHeadersReleasedAfterContinue(t *testing.T) {
	c := hostmodel.NewCore(hostmodel.CoreOptions{})
	st := c.OpenStream(Headers{{":path", "/"}}, nil)
	if c.ReplaceHeaderMapValue(abi.MapHttpRequestHeaders, "x", "1") != abi.StatusOK {
		t.Fatal("paused request headers must be writable")
	}
	c.ContinueStream(0)
	if c.ReplaceHeaderMapValue(abi.MapHttpRequestHeaders, "x", "2") != abi.StatusBadArgument || st.RequestHeaders.Value("x") != "1" {
		t.Fatal("request headers writable after they went upstream")
	}
	if c.AddHeaderMapValue(abi.MapHttpResponseHeaders, "y", "1") != abi.StatusOK {
		t.Fatal("response headers must stay writable")
	}
}
