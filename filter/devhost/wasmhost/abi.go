package wasmhost

import (
	"context"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"

	"github.com/tollgate-rl/tollgate/filter/proxywasm/abi"
	"github.com/tollgate-rl/tollgate/filter/proxywasm/headermap"
	"github.com/tollgate-rl/tollgate/filter/proxywasm/hostmodel"
)

var i32 = api.ValueTypeI32
var i64 = api.ValueTypeI64

// instantiateEnv registers the host functions as module "env".
func (h *Host) instantiateEnv(ctx context.Context) error {
	b := h.rt.NewHostModuleBuilder("env")
	def := func(name string, params []api.ValueType, f hostFunc) {
		export(b, h.slot(name), name, params, abi.StatusInternalFailure, f)
	}
	h.defineBuffers(def)
	h.defineHeaderMaps(def)
	h.defineStream(def)
	h.defineState(def)
	_, err := b.Instantiate(ctx)
	return err
}

// export registers a host function of a VM that answers one i32: each call
// is counted (in VM.calls[slot]) and checked against the VM's phase (a call
// Envoy forbids there traps the VM); a call outside any VM answers noVM.
func export[R ~uint32](b wazero.HostModuleBuilder, slot int, name string, params []api.ValueType, noVM R,
	f func(vm *VM, m api.Module, s []uint64) R) {
	b.NewFunctionBuilder().WithGoModuleFunction(api.GoModuleFunc(func(ctx context.Context, m api.Module, s []uint64) {
		vm, _ := ctx.Value(vmKey{}).(*VM)
		if vm == nil {
			s[0] = uint64(noVM)
			return
		}
		vm.calls[slot]++
		vm.restricted(name)
		s[0] = uint64(f(vm, m, s))
	}), params, []api.ValueType{i32}).Export(name)
}

// i32s is n i32 parameters.
func i32s(n int) []api.ValueType {
	out := make([]api.ValueType, n)
	for i := range out {
		out[i] = i32
	}
	return out
}

// hostFunc is one host function: it reads its parameters from the stack and
// guest memory, calls the model, and answers an ABI status.
type hostFunc func(vm *VM, m api.Module, s []uint64) abi.Status

// definer registers a host function.
type definer func(name string, params []api.ValueType, f hostFunc)

// defineBuffers: logging, time and buffers.
func (h *Host) defineBuffers(def definer) {
	def("proxy_log", i32s(3), func(vm *VM, m api.Module, s []uint64) abi.Status {
		msg, ok := read(m, s[1], s[2])
		if !ok {
			return abi.StatusBadArgument
		}
		vm.Log(abi.LogLevel(s[0]), string(msg))
		return abi.StatusOK
	})
	def("proxy_get_current_time_nanoseconds", i32s(1), func(vm *VM, m api.Module, s []uint64) abi.Status {
		if !m.Memory().WriteUint64Le(uint32(s[0]), uint64(h.opts.Now().UnixNano())) {
			return abi.StatusBadArgument
		}
		return abi.StatusOK
	})
	def("proxy_get_buffer_bytes", i32s(5), func(vm *VM, m api.Module, s []uint64) abi.Status {
		buf, st := vm.GetBuffer(abi.BufferType(s[0]), uint32(s[1]), uint32(s[2]))
		if st != abi.StatusOK {
			return st
		}
		return vm.give(m, buf, s[3], s[4])
	})
}

// defineHeaderMaps: reading and editing header maps.
func (h *Host) defineHeaderMaps(def definer) {
	def("proxy_get_header_map_value", i32s(5), func(vm *VM, m api.Module, s []uint64) abi.Status {
		key, ok := read(m, s[1], s[2])
		if !ok {
			return abi.StatusBadArgument
		}
		v, st := vm.GetHeaderMapValue(abi.MapType(s[0]), string(key))
		if st != abi.StatusOK {
			return st
		}
		return vm.giveString(m, v, s[3], s[4])
	})
	def("proxy_get_header_map_pairs", i32s(3), func(vm *VM, m api.Module, s []uint64) abi.Status {
		pairs, st := vm.GetHeaderMapPairs(abi.MapType(s[0]))
		if st != abi.StatusOK {
			return st
		}
		vm.enc = headermap.AppendEncode(vm.enc[:0], pairs) // give copies it into the guest
		return vm.give(m, vm.enc, s[1], s[2])
	})
	def("proxy_set_header_map_pairs", i32s(3), func(vm *VM, m api.Module, s []uint64) abi.Status {
		data, ok := read(m, s[1], s[2])
		if !ok {
			return abi.StatusBadArgument
		}
		pairs, err := headermap.Decode(data)
		if err != nil {
			return abi.StatusBadArgument
		}
		return vm.SetHeaderMapPairs(abi.MapType(s[0]), pairs)
	})
	mapEdit := func(name string, n int, f func(vm *VM, mapType abi.MapType, key, value string) abi.Status) {
		def(name, i32s(n), func(vm *VM, m api.Module, s []uint64) abi.Status {
			key, ok := read(m, s[1], s[2])
			if !ok {
				return abi.StatusBadArgument
			}
			var value []byte
			if n == 5 {
				if value, ok = read(m, s[3], s[4]); !ok {
					return abi.StatusBadArgument
				}
			}
			return f(vm, abi.MapType(s[0]), vm.headerName(key), string(value))
		})
	}
	mapEdit("proxy_add_header_map_value", 5, func(vm *VM, t abi.MapType, k, v string) abi.Status { return vm.AddHeaderMapValue(t, k, v) })
	mapEdit("proxy_replace_header_map_value", 5, func(vm *VM, t abi.MapType, k, v string) abi.Status { return vm.ReplaceHeaderMapValue(t, k, v) })
	mapEdit("proxy_remove_header_map_value", 3, func(vm *VM, t abi.MapType, k, _ string) abi.Status { return vm.RemoveHeaderMapValue(t, k) })
}

// defineStream: properties, local replies, callouts and stream control.
func (h *Host) defineStream(def definer) {
	def("proxy_get_property", i32s(4), func(vm *VM, m api.Module, s []uint64) abi.Status {
		path, ok := read(m, s[0], s[1])
		if !ok {
			return abi.StatusBadArgument
		}
		v, st := hostmodel.Property(vm.Core, path)
		if st != abi.StatusOK {
			return st
		}
		return vm.giveString(m, v, s[2], s[3])
	})
	def("proxy_send_local_response", []api.ValueType{i32, i32, i32, i32, i32, i32, i32, i32}, func(vm *VM, m api.Module, s []uint64) abi.Status {
		body, ok1 := read(m, s[3], s[4])
		hdrs, ok2 := read(m, s[5], s[6])
		if !ok1 || !ok2 {
			return abi.StatusBadArgument
		}
		pairs, err := headermap.Decode(hdrs)
		if err != nil {
			return abi.StatusBadArgument
		}
		return vm.SendLocalResponse(uint32(s[0]), pairs, body)
	})
	def("proxy_http_call", i32s(10), func(vm *VM, m api.Module, s []uint64) abi.Status {
		cluster, ok1 := read(m, s[0], s[1])
		hdrs, ok2 := read(m, s[2], s[3])
		body, ok3 := read(m, s[4], s[5])
		if !ok1 || !ok2 || !ok3 {
			return abi.StatusBadArgument
		}
		pairs, err := headermap.Decode(hdrs)
		if err != nil {
			return abi.StatusBadArgument
		}
		token, st := vm.HttpCall(string(cluster), pairs, body, uint32(s[8]))
		if st != abi.StatusOK {
			return st
		}
		if !m.Memory().WriteUint32Le(uint32(s[9]), token) {
			return abi.StatusBadArgument
		}
		return abi.StatusOK
	})
	def("proxy_continue_stream", i32s(1), func(vm *VM, m api.Module, s []uint64) abi.Status { return vm.ContinueStream(abi.StreamType(s[0])) })
	def("proxy_close_stream", i32s(1), func(vm *VM, m api.Module, s []uint64) abi.Status { return abi.StatusOK })
	def("proxy_set_effective_context", i32s(1), func(vm *VM, m api.Module, s []uint64) abi.Status {
		return vm.SetEffectiveContext(uint32(s[0]))
	})
}

// defineState: shared data, ticks and metrics.
func (h *Host) defineState(def definer) {
	def("proxy_done", nil, func(vm *VM, m api.Module, s []uint64) abi.Status { return abi.StatusOK })
	def("proxy_get_shared_data", i32s(5), func(vm *VM, m api.Module, s []uint64) abi.Status {
		key, ok := read(m, s[0], s[1])
		if !ok {
			return abi.StatusBadArgument
		}
		val, cas, st := vm.GetSharedData(string(key))
		if st != abi.StatusOK {
			return st
		}
		if st := vm.give(m, val, s[2], s[3]); st != abi.StatusOK {
			return st
		}
		if !m.Memory().WriteUint32Le(uint32(s[4]), cas) {
			return abi.StatusBadArgument
		}
		return abi.StatusOK
	})
	def("proxy_set_shared_data", i32s(5), func(vm *VM, m api.Module, s []uint64) abi.Status {
		key, ok1 := read(m, s[0], s[1])
		val, ok2 := read(m, s[2], s[3])
		if !ok1 || !ok2 {
			return abi.StatusBadArgument
		}
		return vm.SetSharedData(string(key), val, uint32(s[4]))
	})
	def("proxy_set_tick_period_milliseconds", i32s(1), func(vm *VM, m api.Module, s []uint64) abi.Status {
		return vm.SetTickPeriod(uint32(s[0]))
	})
	def("proxy_define_metric", i32s(4), func(vm *VM, m api.Module, s []uint64) abi.Status {
		name, ok := read(m, s[1], s[2])
		if !ok {
			return abi.StatusBadArgument
		}
		id, st := vm.DefineMetric(abi.MetricType(s[0]), string(name))
		if st != abi.StatusOK {
			return st
		}
		if !m.Memory().WriteUint32Le(uint32(s[3]), id) {
			return abi.StatusBadArgument
		}
		return abi.StatusOK
	})
	def("proxy_increment_metric", []api.ValueType{i32, i64}, func(vm *VM, m api.Module, s []uint64) abi.Status {
		return vm.IncrementMetric(uint32(s[0]), int64(s[1]))
	})
	def("proxy_record_metric", []api.ValueType{i32, i64}, func(vm *VM, m api.Module, s []uint64) abi.Status {
		return vm.RecordMetric(uint32(s[0]), s[1])
	})
	def("proxy_get_metric", i32s(2), func(vm *VM, m api.Module, s []uint64) abi.Status {
		v, st := h.metrics.Get(uint32(s[0]))
		if st != abi.StatusOK {
			return st
		}
		if !m.Memory().WriteUint64Le(uint32(s[1]), uint64(v)) {
			return abi.StatusBadArgument
		}
		return abi.StatusOK
	})
}

// give copies data into memory the guest allocates and writes its address and
// size to the guest's out-parameters.
func (vm *VM) give(m api.Module, data []byte, ptrOut, sizeOut uint64) abi.Status {
	ptr, st := vm.reserve(len(data))
	if st == abi.StatusOK && len(data) > 0 && !m.Memory().Write(ptr, data) {
		st = abi.StatusInternalFailure
	}
	return vm.answer(m, st, ptr, len(data), ptrOut, sizeOut)
}

// giveString is give for a string, written without a conversion.
func (vm *VM) giveString(m api.Module, data string, ptrOut, sizeOut uint64) abi.Status {
	ptr, st := vm.reserve(len(data))
	if st == abi.StatusOK && len(data) > 0 && !m.Memory().WriteString(ptr, data) {
		st = abi.StatusInternalFailure
	}
	return vm.answer(m, st, ptr, len(data), ptrOut, sizeOut)
}

// reserve has the guest allocate n bytes (none for 0) for an answer.
func (vm *VM) reserve(n int) (uint32, abi.Status) {
	if n == 0 {
		return 0, abi.StatusOK
	}
	outer := vm.phase
	vm.phase = phaseAlloc
	vm.allocStack[0] = uint64(n)
	err := vm.fn.alloc.CallWithStack(vm.bgCtx, vm.allocStack[:])
	vm.phase = outer
	if err != nil {
		return 0, abi.StatusInternalFailure
	}
	return uint32(vm.allocStack[0]), abi.StatusOK
}

// answer writes an answer's address and size to the out-parameters.
func (vm *VM) answer(m api.Module, st abi.Status, ptr uint32, n int, ptrOut, sizeOut uint64) abi.Status {
	if st != abi.StatusOK {
		return st
	}
	mem := m.Memory()
	if !mem.WriteUint32Le(uint32(ptrOut), ptr) || !mem.WriteUint32Le(uint32(sizeOut), uint32(n)) {
		return abi.StatusBadArgument
	}
	return abi.StatusOK
}

// read is a view of guest memory, valid until the guest runs again: every
// caller copies what it keeps (into strings, or Core's own copies of bodies
// and shared values), so it is not copied here first.
func read(m api.Module, ptr, size uint64) ([]byte, bool) {
	p, n := uint32(ptr), uint32(size)
	if n == 0 {
		return nil, true
	}
	return m.Memory().Read(p, n)
}

// headerName is a header name the guest passed, as a string: the names a
// filter edits are few and the same on every request (its rate-limit and
// identity fields), so each is kept once (up to maxHeaderNames) rather
// than copied on every call.
func (vm *VM) headerName(b []byte) string {
	if s, ok := vm.headerNames[string(b)]; ok {
		return s
	}
	s := string(b)
	if len(vm.headerNames) < maxHeaderNames {
		if vm.headerNames == nil {
			vm.headerNames = make(map[string]string)
		}
		vm.headerNames[s] = s
	}
	return s
}

// maxHeaderNames bounds headerName's strings per VM.
const maxHeaderNames = 64
