package wasmhost

import (
	"context"
	"strings"
	"time"

	"github.com/tetratelabs/wazero/api"

	"github.com/tollgate-rl/tollgate/filter/proxywasm/headermap"
)

// ABI statuses.
const (
	stOK          = 0
	stNotFound    = 1
	stBadArgument = 2
	stCasMismatch = 8
	stInternal    = 10
)

// Map and buffer types.
const (
	mapRequestHeaders     = 0
	mapResponseHeaders    = 2
	mapCallResponseHeader = 6

	bufCallResponseBody = 4
	bufVMConfig         = 6
	bufPluginConfig     = 7
)

var i32 = api.ValueTypeI32
var i64 = api.ValueTypeI64

// instantiateEnv registers the host functions as module "env".
func (h *Host) instantiateEnv(ctx context.Context) error {
	b := h.rt.NewHostModuleBuilder("env")
	def := func(name string, params, results []api.ValueType, f func(vm *VM, m api.Module, s []uint64) uint32) {
		b.NewFunctionBuilder().WithGoModuleFunction(api.GoModuleFunc(func(ctx context.Context, m api.Module, stack []uint64) {
			vm, _ := ctx.Value(vmKey{}).(*VM)
			if vm == nil {
				stack[0] = stInternal
				return
			}
			vm.calls[name]++
			vm.restricted(name)
			st := f(vm, m, stack)
			if len(results) > 0 {
				stack[0] = uint64(st)
			}
		}), params, results).Export(name)
	}
	p := func(n int) []api.ValueType {
		out := make([]api.ValueType, n)
		for i := range out {
			out[i] = i32
		}
		return out
	}
	r := []api.ValueType{i32}

	def("proxy_log", p(3), r, func(vm *VM, m api.Module, s []uint64) uint32 {
		msg, ok := read(m, s[1], s[2])
		if !ok {
			return stBadArgument
		}
		lvl := LogLevel(uint32(s[0]))
		vm.logs = append(vm.logs, LogLine{Level: lvl, Msg: string(msg)})
		if len(vm.logs) > 1000 {
			vm.logs = vm.logs[len(vm.logs)-500:]
		}
		if h.opts.Log != nil {
			h.opts.Log(lvl, string(msg))
		}
		return stOK
	})
	def("proxy_get_current_time_nanoseconds", p(1), r, func(vm *VM, m api.Module, s []uint64) uint32 {
		if !m.Memory().WriteUint64Le(uint32(s[0]), uint64(h.opts.Now().UnixNano())) {
			return stBadArgument
		}
		return stOK
	})
	def("proxy_get_buffer_bytes", p(5), r, func(vm *VM, m api.Module, s []uint64) uint32 {
		var buf []byte
		switch uint32(s[0]) {
		case bufPluginConfig:
			buf = h.opts.PluginConfig
		case bufVMConfig:
			buf = nil
		case bufCallResponseBody:
			if vm.delivery == nil {
				return stNotFound
			}
			buf = vm.delivery.Body
		default:
			return stNotFound
		}
		start, size := uint64(uint32(s[1])), uint64(uint32(s[2]))
		if start > uint64(len(buf)) {
			return stBadArgument
		}
		end := min(start+size, uint64(len(buf)))
		if len(buf) == 0 && uint32(s[0]) == bufPluginConfig {
			return stNotFound
		}
		return vm.give(m, buf[start:end], s[3], s[4])
	})
	def("proxy_get_header_map_value", p(5), r, func(vm *VM, m api.Module, s []uint64) uint32 {
		hm := vm.headerMap(uint32(s[0]))
		key, ok := read(m, s[1], s[2])
		if hm == nil || !ok {
			return stBadArgument
		}
		v, found := hm.Get(string(key))
		if !found {
			return stNotFound
		}
		return vm.give(m, []byte(v), s[3], s[4])
	})
	def("proxy_get_header_map_pairs", p(3), r, func(vm *VM, m api.Module, s []uint64) uint32 {
		hm := vm.headerMap(uint32(s[0]))
		if hm == nil {
			return stBadArgument
		}
		return vm.give(m, headermap.Encode(*hm), s[1], s[2])
	})
	def("proxy_set_header_map_pairs", p(3), r, func(vm *VM, m api.Module, s []uint64) uint32 {
		hm := vm.writableMap(uint32(s[0]))
		data, ok := read(m, s[1], s[2])
		if hm == nil || !ok {
			return stBadArgument
		}
		pairs, err := headermap.Decode(data)
		if err != nil {
			return stBadArgument
		}
		*hm = LowerKeys(pairs)
		return stOK
	})
	mapEdit := func(name string, n int, f func(hm *Headers, key, value string)) {
		def(name, p(n), r, func(vm *VM, m api.Module, s []uint64) uint32 {
			hm := vm.writableMap(uint32(s[0]))
			key, ok := read(m, s[1], s[2])
			if hm == nil || !ok {
				return stBadArgument
			}
			var value []byte
			if n == 5 {
				if value, ok = read(m, s[3], s[4]); !ok {
					return stBadArgument
				}
			}
			f(hm, string(key), string(value))
			return stOK
		})
	}
	mapEdit("proxy_add_header_map_value", 5, func(hm *Headers, k, v string) { hm.Add(k, v) })
	mapEdit("proxy_replace_header_map_value", 5, func(hm *Headers, k, v string) { hm.Replace(k, v) })
	mapEdit("proxy_remove_header_map_value", 3, func(hm *Headers, k, _ string) { hm.Remove(k) })

	def("proxy_get_property", p(4), r, func(vm *VM, m api.Module, s []uint64) uint32 {
		path, ok := read(m, s[0], s[1])
		if !ok {
			return stBadArgument
		}
		st := vm.streams[vm.effective]
		if st == nil {
			return stNotFound
		}
		v, found := st.Properties[strings.ReplaceAll(string(path), "\x00", ".")]
		if !found {
			return stNotFound
		}
		return vm.give(m, []byte(v), s[2], s[3])
	})
	def("proxy_send_local_response", []api.ValueType{i32, i32, i32, i32, i32, i32, i32, i32}, r, func(vm *VM, m api.Module, s []uint64) uint32 {
		st := vm.streams[vm.effective]
		body, ok1 := read(m, s[3], s[4])
		hdrs, ok2 := read(m, s[5], s[6])
		if st == nil || !ok1 || !ok2 {
			return stBadArgument
		}
		pairs, err := headermap.Decode(hdrs)
		if err != nil {
			return stBadArgument
		}
		st.Local = &LocalResponse{Status: int(uint32(s[0])), Headers: LowerKeys(pairs), Body: append([]byte(nil), body...)}
		return stOK
	})
	def("proxy_http_call", p(10), r, func(vm *VM, m api.Module, s []uint64) uint32 {
		cluster, ok1 := read(m, s[0], s[1])
		hdrs, ok2 := read(m, s[2], s[3])
		body, ok3 := read(m, s[4], s[5])
		if !ok1 || !ok2 || !ok3 || !h.clusters[string(cluster)] {
			return stBadArgument // Envoy: unknown cluster
		}
		hm, ok := calloutHeaders(hdrs)
		if !ok {
			return stBadArgument
		}
		vm.nextToken++
		c := &Callout{Token: vm.nextToken, ContextID: vm.effective, Cluster: string(cluster), Headers: hm,
			Body: append([]byte(nil), body...), Timeout: uint32(s[8])}
		if !m.Memory().WriteUint32Le(uint32(s[9]), c.Token) {
			return stBadArgument
		}
		vm.callouts[c.Token] = c
		if vm.OnCallout != nil {
			vm.OnCallout(c)
		}
		return stOK
	})
	def("proxy_continue_stream", p(1), r, func(vm *VM, m api.Module, s []uint64) uint32 {
		st := vm.streams[vm.effective]
		if st == nil {
			return stBadArgument
		}
		if uint32(s[0]) == 0 {
			st.Resumed = true
			st.requestSent = true // Envoy releases the request headers here
		}
		return stOK
	})
	def("proxy_close_stream", p(1), r, func(vm *VM, m api.Module, s []uint64) uint32 { return stOK })
	def("proxy_set_effective_context", p(1), r, func(vm *VM, m api.Module, s []uint64) uint32 {
		id := uint32(s[0])
		if _, ok := vm.streams[id]; !ok && id != vm.rootID {
			return stBadArgument
		}
		vm.effective = id
		return stOK
	})
	def("proxy_done", nil, r, func(vm *VM, m api.Module, s []uint64) uint32 { return stOK })
	def("proxy_get_shared_data", p(5), r, func(vm *VM, m api.Module, s []uint64) uint32 {
		key, ok := read(m, s[0], s[1])
		if !ok {
			return stBadArgument
		}
		val, cas, found := h.shared.Get(string(key))
		if !found {
			return stNotFound
		}
		if st := vm.give(m, val, s[2], s[3]); st != stOK {
			return st
		}
		if !m.Memory().WriteUint32Le(uint32(s[4]), cas) {
			return stBadArgument
		}
		return stOK
	})
	def("proxy_set_shared_data", p(5), r, func(vm *VM, m api.Module, s []uint64) uint32 {
		key, ok1 := read(m, s[0], s[1])
		val, ok2 := read(m, s[2], s[3])
		if !ok1 || !ok2 {
			return stBadArgument
		}
		return h.shared.Set(string(key), val, uint32(s[4]))
	})
	def("proxy_set_tick_period_milliseconds", p(1), r, func(vm *VM, m api.Module, s []uint64) uint32 {
		vm.tick = time.Duration(uint32(s[0])) * time.Millisecond
		return stOK
	})
	def("proxy_define_metric", p(4), r, func(vm *VM, m api.Module, s []uint64) uint32 {
		name, ok := read(m, s[1], s[2])
		if !ok {
			return stBadArgument
		}
		id, st := h.metrics.Define(uint32(s[0]), string(name))
		if st != stOK {
			return st
		}
		if !m.Memory().WriteUint32Le(uint32(s[3]), id) {
			return stBadArgument
		}
		return stOK
	})
	def("proxy_increment_metric", []api.ValueType{i32, i64}, r, func(vm *VM, m api.Module, s []uint64) uint32 {
		return h.metrics.Increment(uint32(s[0]), int64(s[1]))
	})
	def("proxy_record_metric", []api.ValueType{i32, i64}, r, func(vm *VM, m api.Module, s []uint64) uint32 {
		return h.metrics.Record(uint32(s[0]), s[1])
	})
	def("proxy_get_metric", p(2), r, func(vm *VM, m api.Module, s []uint64) uint32 {
		v, st := h.metrics.Get(uint32(s[0]))
		if st != stOK {
			return st
		}
		if !m.Memory().WriteUint64Le(uint32(s[1]), uint64(v)) {
			return stBadArgument
		}
		return stOK
	})
	_, err := b.Instantiate(ctx)
	return err
}

// calloutHeaders decodes a callout's headers; Envoy refuses (BadArgument) a
// callout without :method, :path or :authority.
func calloutHeaders(raw []byte) (Headers, bool) {
	pairs, err := headermap.Decode(raw)
	if err != nil {
		return nil, false
	}
	hm := LowerKeys(pairs)
	for _, required := range []string{":method", ":path", ":authority"} {
		if hm.Value(required) == "" {
			return nil, false
		}
	}
	return hm, true
}

// headerMap returns a readable map of the effective context.
func (vm *VM) headerMap(t uint32) *Headers {
	if t == mapCallResponseHeader {
		if vm.delivery == nil {
			return nil
		}
		return &vm.delivery.Headers
	}
	return vm.writableMap(t)
}

// writableMap returns a stream's request or response headers.
func (vm *VM) writableMap(t uint32) *Headers {
	st := vm.streams[vm.effective]
	if st == nil {
		return nil
	}
	switch t {
	case mapRequestHeaders:
		if st.requestSent {
			return nil // gone upstream: Envoy answers BadArgument
		}
		return &st.RequestHeaders
	case mapResponseHeaders:
		return &st.ResponseHeaders
	}
	return nil
}

// give copies data into memory the guest allocates and writes its address and
// size to the guest's out-parameters.
func (vm *VM) give(m api.Module, data []byte, ptrOut, sizeOut uint64) uint32 {
	var ptr uint32
	if len(data) > 0 {
		outer := vm.phase
		vm.phase = phaseAlloc
		res, err := vm.fn.alloc.Call(context.WithValue(context.Background(), vmKey{}, vm), uint64(len(data)))
		vm.phase = outer
		if err != nil || len(res) == 0 {
			return stInternal
		}
		ptr = uint32(res[0])
		if !m.Memory().Write(ptr, data) {
			return stInternal
		}
	}
	mem := m.Memory()
	if !mem.WriteUint32Le(uint32(ptrOut), ptr) || !mem.WriteUint32Le(uint32(sizeOut), uint32(len(data))) {
		return stBadArgument
	}
	return stOK
}

// read copies guest memory; the guest may reuse it once the call returns.
func read(m api.Module, ptr, size uint64) ([]byte, bool) {
	p, n := uint32(ptr), uint32(size)
	if n == 0 {
		return nil, true
	}
	b, ok := m.Memory().Read(p, n)
	if !ok {
		return nil, false
	}
	return append([]byte(nil), b...), true
}
