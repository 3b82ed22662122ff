// Package wasmhost runs a proxy-wasm module (ABI v0.2.1) under wazero the way
// Envoy does: one Host per plugin configuration, several VMs of it side by
// side (Envoy's worker threads) sharing shared data and metrics, HTTP streams
// with header maps and pseudo-headers, asynchronous callouts, local replies,
// properties and ticks. Tests, benchmarks and the local gateway drive the
// compiled filter through it; nothing of the filter is mocked.
package wasmhost

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/experimental"
	"github.com/tetratelabs/wazero/sys"

	"github.com/tollgate-rl/tollgate/filter/proxywasm/abi"
	"github.com/tollgate-rl/tollgate/filter/proxywasm/hostmodel"
)

// Options configure a Host.
type Options struct {
	// PluginConfig is the plugin configuration (buffer type 7).
	PluginConfig []byte
	// Clusters are the upstream clusters a callout may name; any other name
	// is refused with BadArgument, as Envoy refuses an unknown cluster.
	Clusters []string
	// Now is the clock the guest sees (WASI wall and monotonic time).
	// Default time.Now; tests pin it.
	Now func() time.Time
	// Log receives the guest's proxy_log lines (default: kept per VM only).
	Log func(level LogLevel, msg string)
	// Output receives the guest's stdout and stderr (Go panics). Default
	// io.Discard.
	Output io.Writer
	// CompilationCache, when set, is shared by hosts of one process.
	CompilationCache wazero.CompilationCache
	// Interpreter selects wazero's interpreter instead of its compiler.
	Interpreter bool
	// WASI selects the WASI the module gets: wazero's whole (default) or
	// Envoy's partial one (see WASIEnvoy).
	WASI WASI
	// Env is the VM's environment, "KEY=value" each: what Envoy's
	// vm_config.environment_variables give it.
	Env []string
}

// LogLevel is a proxy-wasm log level.
type LogLevel = abi.LogLevel

const (
	LogTrace    = abi.LogTrace
	LogDebug    = abi.LogDebug
	LogInfo     = abi.LogInfo
	LogWarn     = abi.LogWarn
	LogError    = abi.LogError
	LogCritical = abi.LogCritical
)

// Host is one plugin: a compiled module, its configuration, and the state
// its VMs share.
type Host struct {
	opts     Options
	rt       wazero.Runtime
	compiled wazero.CompiledModule
	clusters map[string]bool
	// slots numbers the host functions, for VM.calls; written only while
	// New defines them.
	slots map[string]int

	shared  SharedData
	metrics Metrics
	vmSeq   atomic.Uint64
}

// New compiles the module. Compile once, then make VMs.
func New(ctx context.Context, wasm []byte, opts Options) (*Host, error) {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Output == nil {
		opts.Output = io.Discard
	}
	cfg := wazero.NewRuntimeConfigCompiler()
	if opts.Interpreter {
		cfg = wazero.NewRuntimeConfigInterpreter()
	}
	if opts.CompilationCache != nil {
		cfg = cfg.WithCompilationCache(opts.CompilationCache)
	}
	rt := wazero.NewRuntimeWithConfig(ctx, cfg)
	h := &Host{opts: opts, rt: rt, clusters: map[string]bool{}}
	for _, c := range opts.Clusters {
		h.clusters[c] = true
	}
	if err := h.instantiateWASI(ctx); err != nil {
		rt.Close(ctx)
		return nil, fmt.Errorf("wasi: %w", err)
	}
	if err := h.instantiateEnv(ctx); err != nil {
		rt.Close(ctx)
		return nil, fmt.Errorf("proxy-wasm host module: %w", err)
	}
	compiled, err := rt.CompileModule(ctx, wasm)
	if err != nil {
		rt.Close(ctx)
		return nil, fmt.Errorf("compile module: %w", err)
	}
	if _, ok := compiled.ExportedFunctions()["proxy_abi_version_0_2_1"]; !ok {
		rt.Close(ctx)
		return nil, errors.New("module does not export proxy_abi_version_0_2_1")
	}
	h.compiled = compiled
	return h, nil
}

// Close releases the runtime and every VM.
func (h *Host) Close(ctx context.Context) error { return h.rt.Close(ctx) }

// Counter returns a counter's (or gauge's) value by name.
func (h *Host) Counter(name string) int64 { return h.metrics.Value(name) }

// Histogram returns a histogram's recorded values by name.
func (h *Host) Histogram(name string) []uint64 { return h.metrics.Samples(name) }

// VM is one instance of the module, as one Envoy worker holds. A VM is not
// safe for concurrent use; a host that serves in parallel uses several VMs.
type VM struct {
	*Core // the host model; this VM is its wazero front
	host  *Host
	mod   api.Module
	fn    exports

	broken error
	calls  []int // calls of each host function, by its slot (Host.slot)

	// bgCtx is context.Background with this VM in it, made once: every
	// call runs with it, and the host functions find their VM there.
	// stack and allocStack are the parameter and result slots of a call
	// (allocStack for proxy_on_memory_allocate, which runs inside another
	// call), and enc is reused to serialise header maps: a call into the
	// guest allocates nothing on the host's side of its own. headerNames
	// holds the header names the guest edits (headerName).
	bgCtx       context.Context
	stack       [8]uint64
	allocStack  [1]uint64
	enc         []byte
	headerNames map[string]string

	phase      phase    // what the VM is doing, for Envoy's allow-lists
	violations []string // calls Envoy would have refused in that phase
}

type exports struct {
	alloc, vmStart, configure, contextCreate, requestHeaders, requestBody, responseHeaders, responseBody,
	callResponse, tick, done, log, del api.Function
}

type vmKey struct{}

// NewVM instantiates the module, runs _initialize, starts the VM and
// configures the plugin. A plugin that refuses its configuration is an error,
// with the guest's critical log lines in it.
func (h *Host) NewVM(ctx context.Context) (*VM, error) {
	now := h.opts.Now
	cfg := wazero.NewModuleConfig().
		WithName(fmt.Sprintf("tollgate-vm-%d", h.vmSeq.Add(1))).
		WithStartFunctions("_initialize").
		WithStdout(h.opts.Output).WithStderr(h.opts.Output).
		WithRandSource(rand.Reader).
		WithWalltime(func() (int64, int32) { t := now(); return t.Unix(), int32(t.Nanosecond()) }, sys.ClockResolution(1)).
		WithNanotime(func() int64 { return now().UnixNano() }, sys.ClockResolution(1))
	for _, kv := range h.opts.Env {
		if k, v, ok := strings.Cut(kv, "="); ok {
			cfg = cfg.WithEnv(k, v)
		}
	}
	vm := &VM{host: h, calls: make([]int, len(h.slots)),
		Core: hostmodel.NewCore(hostmodel.CoreOptions{PluginConfig: h.opts.PluginConfig, Clusters: h.opts.Clusters, Shared: &h.shared, Metrics: &h.metrics, Log: h.opts.Log})}
	vm.bgCtx = context.WithValue(context.Background(), vmKey{}, vm)
	vm.phase = phaseInit // _initialize runs inside InstantiateModule
	ictx := experimental.WithMemoryAllocator(context.WithValue(ctx, vmKey{}, vm), reservedMemory)
	mod, err := h.rt.InstantiateModule(ictx, h.compiled, cfg)
	vm.phase = phaseRun
	if err != nil {
		return nil, fmt.Errorf("instantiate: %w", err)
	}
	vm.mod = mod
	get := func(name string) api.Function { return mod.ExportedFunction(name) }
	vm.fn = exports{
		alloc: get("proxy_on_memory_allocate"), vmStart: get("proxy_on_vm_start"), configure: get("proxy_on_configure"),
		contextCreate: get("proxy_on_context_create"), requestHeaders: get("proxy_on_request_headers"),
		requestBody:     get("proxy_on_request_body"),
		responseHeaders: get("proxy_on_response_headers"), responseBody: get("proxy_on_response_body"), callResponse: get("proxy_on_http_call_response"),
		tick: get("proxy_on_tick"), done: get("proxy_on_done"), log: get("proxy_on_log"), del: get("proxy_on_delete"),
	}
	if vm.fn.alloc == nil || vm.fn.contextCreate == nil || vm.fn.requestHeaders == nil {
		mod.Close(ctx)
		return nil, errors.New("module lacks proxy_on_memory_allocate, proxy_on_context_create or proxy_on_request_headers")
	}
	if _, err := vm.call(vm.fn.contextCreate, uint64(vm.RootID()), 0); err != nil {
		return nil, err
	}
	if vm.fn.vmStart != nil {
		r, err := vm.call(vm.fn.vmStart, uint64(vm.RootID()), 0)
		if err != nil {
			return nil, err
		}
		if r == 0 {
			return nil, fmt.Errorf("proxy_on_vm_start failed: %s", vm.criticalLogs())
		}
	}
	if vm.fn.configure != nil {
		r, err := vm.call(vm.fn.configure, uint64(vm.RootID()), uint64(len(h.opts.PluginConfig)))
		if err != nil {
			return nil, err
		}
		if r == 0 {
			return nil, fmt.Errorf("proxy_on_configure failed: %s", vm.criticalLogs())
		}
	}
	return vm, nil
}

// Close releases the VM and its memory. No call reaches the guest after
// it (each answers errClosed): its memory is unmapped.
func (vm *VM) Close(ctx context.Context) error {
	if vm.broken == nil {
		vm.broken = errClosed
	}
	return vm.mod.Close(ctx)
}

var errClosed = errors.New("the VM is closed")

// MemorySize is the guest's linear memory in bytes (0 once closed).
func (vm *VM) MemorySize() uint32 {
	if vm.broken == errClosed {
		return 0
	}
	return vm.mod.Memory().Size()
}

// HostCalls is how many times the guest called a host function (by its
// import name, "proxy_remove_header_map_value"): tests bound the work a hostile
// request makes the filter do.
func (vm *VM) HostCalls(name string) int {
	i, ok := vm.host.slots[name]
	if !ok {
		return 0
	}
	return vm.calls[i]
}

// slot numbers a host function for VM.calls as it is defined: a call is
// counted by index, where a map keyed by its name cost a string hash on
// every call the guest makes.
func (h *Host) slot(name string) int {
	if i, ok := h.slots[name]; ok {
		return i
	}
	if h.slots == nil {
		h.slots = map[string]int{}
	}
	h.slots[name] = len(h.slots)
	return h.slots[name]
}

// Broken is the error of a guest trap (a Go panic inside the module); a
// broken VM should be discarded, as Envoy would.
func (vm *VM) Broken() error { return vm.broken }

func (vm *VM) criticalLogs() string {
	msg := ""
	for _, l := range vm.Core.Logs() {
		if l.Level >= LogError {
			if msg != "" {
				msg += "; "
			}
			msg += l.Msg
		}
	}
	if msg == "" {
		msg = "no error logged"
	}
	return msg
}

// call runs one guest export. Host functions find the VM in vm.bgCtx, made
// once: no call is cancelled through a context (the runtime does not close
// modules on a context's end), so a caller's context would only cost an
// allocation on every call.
func (vm *VM) call(f api.Function, params ...uint64) (uint64, error) {
	if vm.broken != nil {
		return 0, vm.broken
	}
	if f == nil {
		return 0, nil
	}
	ctx := vm.bgCtx
	// Every export takes at most 5 parameters and answers at most one
	// result, so the slots fit; the result is read from slot 0 only when
	// the export has one.
	stack := vm.stack[:]
	copy(stack, params)
	if err := f.CallWithStack(ctx, stack); err != nil {
		vm.broken = fmt.Errorf("guest trapped: %w", err)
		return 0, vm.broken
	}
	if len(f.Definition().ResultTypes()) == 0 {
		return 0, nil
	}
	return stack[0], nil
}

// GuestAllocs is the module's cumulative count of heap allocations, read
// through its tollgate_debug_allocs export (Tollgate's own module exports it
// for benchmarks); ok is false for a module without it.
func (vm *VM) GuestAllocs(ctx context.Context) (n uint64, ok bool) {
	f := vm.mod.ExportedFunction("tollgate_debug_allocs")
	if f == nil {
		return 0, false
	}
	n, err := vm.call(f)
	return n, err == nil
}

// GCCycles is the number of garbage collections the module has run, read
// through its tollgate_debug_gc_cycles export; 0 for a module without it.
func (vm *VM) GCCycles() uint64 {
	f := vm.mod.ExportedFunction("tollgate_debug_gc_cycles")
	if f == nil {
		return 0
	}
	n, _ := vm.call(f)
	return n
}

// Tick runs the plugin's tick once (if the plugin asked for ticks).
func (vm *VM) Tick(ctx context.Context) error {
	if vm.TickPeriod() == 0 {
		return nil
	}
	_, err := vm.call(vm.fn.tick, uint64(vm.RootID()))
	return err
}
