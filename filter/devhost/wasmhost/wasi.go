package wasmhost

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"strconv"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"
	"github.com/tetratelabs/wazero/sys"
)

// WASI selects the WASI functions a host gives its modules.
type WASI int

const (
	// WASIFull is wazero's complete WASI preview 1: kinder than Envoy.
	WASIFull WASI = iota
	// WASIEnvoy is the partial WASI of Envoy's proxy-wasm host
	// (proxy-wasm-cpp-host) in Envoy 1.33 to 1.38: stdout and stderr only,
	// no files, no arguments or environment, clocks and randomness, and
	// poll_oneoff answering ENOSYS, which Go's runtime treats as fatal (so a
	// filter must never need its poller: no goroutines, timers or sleeps).
	// During _initialize and during memory allocation only an allow-list of
	// calls succeeds, as in cpp-host.
	WASIEnvoy
	// WASIEnvoyNewer is WASIEnvoy as later cpp-host behaves: poll_oneoff
	// succeeds (with no events) and is allowed during memory allocation.
	WASIEnvoyNewer
)

func (w WASI) String() string {
	switch w {
	case WASIFull:
		return "full WASI"
	case WASIEnvoy:
		return "Envoy 1.33-1.38 WASI"
	case WASIEnvoyNewer:
		return "Envoy 1.39+ WASI"
	}
	return "WASI(" + strconv.Itoa(int(w)) + ")"
}

// WASI errnos.
const (
	errnoSuccess = 0
	errnoBadf    = 8
	errnoNosys   = 52
)

// phase is what the VM is doing, for the allow-lists.
type phase int

const (
	phaseRun   phase = iota
	phaseInit        // _initialize
	phaseAlloc       // proxy_on_memory_allocate, called by the host
)

// The host calls cpp-host permits while a VM initialises and while it
// allocates memory for the host (Envoy 1.33 to 1.38; later versions add
// poll_oneoff to both and more to _initialize). Any other call traps the VM.
var (
	allowedInit = map[string]bool{
		"proxy_log": true, "fd_write": true, "args_sizes_get": true, "args_get": true,
		"environ_sizes_get": true, "environ_get": true, "fd_prestat_get": true, "fd_prestat_dir_name": true,
		"clock_time_get": true, "random_get": true, "fd_fdstat_get": true, "fd_fdstat_set_flags": true,
	}
	allowedAlloc = map[string]bool{"proxy_log": true, "fd_write": true, "clock_time_get": true}
)

// restricted records, and traps on, a call made where cpp-host forbids it.
func (vm *VM) restricted(name string) {
	allowed := true
	switch vm.phase {
	case phaseInit:
		allowed = allowedInit[name] || (name == "poll_oneoff" || name == "sched_yield") && vm.host.opts.WASI == WASIEnvoyNewer
	case phaseAlloc:
		allowed = allowedAlloc[name] || name == "poll_oneoff" && vm.host.opts.WASI == WASIEnvoyNewer
	}
	if allowed || vm.host.opts.WASI == WASIFull {
		return
	}
	msg := fmt.Sprintf("%s during %s", name, vm.phase)
	vm.violations = append(vm.violations, msg)
	panic("restricted_callback: " + msg) // Envoy's V8 traps the VM here
}

func (p phase) String() string {
	switch p {
	case phaseInit:
		return "_initialize"
	case phaseAlloc:
		return "memory allocation"
	}
	return "a callback"
}

// Violations lists the host calls the guest made where Envoy would have
// refused them (during _initialize or memory allocation).
func (vm *VM) Violations() []string { return append([]string(nil), vm.violations...) }

// instantiateWASI registers the WASI module the options select.
func (h *Host) instantiateWASI(ctx context.Context) error {
	if h.opts.WASI == WASIFull {
		_, err := wasi_snapshot_preview1.Instantiate(ctx, h.rt)
		return err
	}
	b := h.rt.NewHostModuleBuilder(wasi_snapshot_preview1.ModuleName)
	def := func(name string, params int, f func(vm *VM, m api.Module, s []uint64) uint32) {
		export(b, h.slot(name), name, i32s(params), errnoNosys, f)
	}
	defineWASIArgs(def, h.opts.Env)
	defineWASIFiles(def)
	h.defineWASIRuntime(b, def)
	_, err := b.Instantiate(ctx)
	return err
}

// wasiDefiner registers a WASI function of params i32 parameters that answers
// an errno.
type wasiDefiner func(name string, params int, f func(vm *VM, m api.Module, s []uint64) uint32)

func wasiOK(*VM, api.Module, []uint64) uint32    { return errnoSuccess }
func wasiNosys(*VM, api.Module, []uint64) uint32 { return errnoNosys }

// defineWASIArgs: no arguments; the environment Envoy gives the VM
// (vm_config.environment_variables), as "KEY=value" strings.
func defineWASIArgs(def wasiDefiner, env []string) {
	size := 0
	for _, kv := range env {
		size += len(kv) + 1
	}
	counts := func(n, size int) func(_ *VM, m api.Module, s []uint64) uint32 {
		return func(_ *VM, m api.Module, s []uint64) uint32 {
			mem := m.Memory()
			if !mem.WriteUint32Le(uint32(s[0]), uint32(n)) || !mem.WriteUint32Le(uint32(s[1]), uint32(size)) {
				return errnoBadf
			}
			return errnoSuccess
		}
	}
	def("args_sizes_get", 2, counts(0, 0))
	def("environ_sizes_get", 2, counts(len(env), size))
	def("args_get", 2, wasiOK)
	def("environ_get", 2, func(_ *VM, m api.Module, s []uint64) uint32 {
		mem := m.Memory()
		ptrs, buf := uint32(s[0]), uint32(s[1])
		for i, kv := range env {
			if !mem.WriteUint32Le(ptrs+uint32(4*i), buf) || !mem.Write(buf, append([]byte(kv), 0)) {
				return errnoBadf
			}
			buf += uint32(len(kv) + 1)
		}
		return errnoSuccess
	})
}

// defineWASIFiles: stdout and stderr, no files and no preopened directories.
func defineWASIFiles(def wasiDefiner) {
	def("fd_write", 4, fdWrite)
	def("fd_read", 4, wasiNosys)
	def("fd_close", 1, wasiOK) // cpp-host logs an error and succeeds
	def("fd_fdstat_set_flags", 2, wasiNosys)
	def("fd_prestat_get", 2, func(*VM, api.Module, []uint64) uint32 { return errnoBadf })
	def("fd_prestat_dir_name", 3, wasiNosys)
	def("fd_fdstat_get", 2, fdFdstatGet)
}

// fdWrite(fd, iovs, iovs_len, written) copies what the guest writes to
// stdout or stderr to the host's Output.
func fdWrite(vm *VM, m api.Module, s []uint64) uint32 {
	fd, iovs, n, written := uint32(s[0]), uint32(s[1]), uint32(s[2]), uint32(s[3])
	if fd != 1 && fd != 2 {
		return errnoBadf
	}
	mem := m.Memory()
	total := uint32(0)
	for i := uint32(0); i < n; i++ {
		ptr, ok1 := mem.ReadUint32Le(iovs + 8*i)
		size, ok2 := mem.ReadUint32Le(iovs + 8*i + 4)
		data, ok3 := mem.Read(ptr, size)
		if !ok1 || !ok2 || !ok3 {
			return errnoBadf
		}
		_, _ = vm.host.opts.Output.Write(data)
		total += size
	}
	if !mem.WriteUint32Le(written, total) {
		return errnoBadf
	}
	return errnoSuccess
}

// fdFdstatGet(fd, stat) answers for stdout and stderr only, as cpp-host
// does: file type unknown, no flags (so Go's os package keeps them blocking
// and never starts its poller for them), the right to write.
func fdFdstatGet(_ *VM, m api.Module, s []uint64) uint32 {
	fd := uint32(s[0])
	if fd != 1 && fd != 2 {
		return errnoBadf
	}
	var st [24]byte
	binary.LittleEndian.PutUint64(st[8:], 1<<6) // fd_write
	if !m.Memory().Write(uint32(s[1]), st[:]) {
		return errnoBadf
	}
	return errnoSuccess
}

// defineWASIRuntime: randomness, scheduling, the clock and exit.
func (h *Host) defineWASIRuntime(b wazero.HostModuleBuilder, def wasiDefiner) {
	def("random_get", 2, func(_ *VM, m api.Module, s []uint64) uint32 {
		buf := make([]byte, uint32(s[1]))
		_, _ = rand.Read(buf)
		if !m.Memory().Write(uint32(s[0]), buf) {
			return errnoBadf
		}
		return errnoSuccess
	})
	def("sched_yield", 0, wasiOK)
	def("poll_oneoff", 4, func(vm *VM, m api.Module, s []uint64) uint32 {
		if vm.host.opts.WASI == WASIEnvoy {
			return errnoNosys
		}
		if !m.Memory().WriteUint32Le(uint32(s[3]), 0) {
			return errnoBadf
		}
		return errnoSuccess
	})
	// clock_time_get(id i32, precision i64, out *u64) answers the host's
	// clock with or without a VM, and is allowed in every phase.
	clock := h.slot("clock_time_get")
	b.NewFunctionBuilder().WithGoModuleFunction(api.GoModuleFunc(func(ctx context.Context, m api.Module, s []uint64) {
		if vm, _ := ctx.Value(vmKey{}).(*VM); vm != nil {
			vm.calls[clock]++
		}
		if id := uint32(s[0]); id > 1 { // realtime and monotonic only
			s[0] = errnoNosys
			return
		}
		if !m.Memory().WriteUint64Le(uint32(s[2]), uint64(h.opts.Now().UnixNano())) {
			s[0] = errnoBadf
			return
		}
		s[0] = errnoSuccess
	}), []api.ValueType{i32, i64, i32}, []api.ValueType{i32}).Export("clock_time_get")
	b.NewFunctionBuilder().WithGoModuleFunction(api.GoModuleFunc(func(ctx context.Context, m api.Module, s []uint64) {
		// cpp-host ends the VM; here the module's exit closes it.
		_ = m.CloseWithExitCode(ctx, uint32(s[0]))
		panic(sys.NewExitError(uint32(s[0])))
	}), []api.ValueType{i32}, nil).Export("proc_exit")
}
