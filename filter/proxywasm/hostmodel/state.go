package hostmodel

import (
	"sync"

	"github.com/tollgate-rl/tollgate/filter/proxywasm/abi"
)

// The state a host keeps across a plugin's VMs, with Envoy's semantics, in
// one place: the wazero host's functions and proxytest's native host both
// use it, so the unit tests and the module's tests see the same rules.

// SharedData is proxy-wasm shared data: values with a CAS that changes with
// every write, shared by every VM of a host (Envoy: per vm_id, process-wide).
// Safe for concurrent use.
type SharedData struct {
	mu  sync.Mutex
	m   map[string]sharedEntry
	cas uint32
}

type sharedEntry struct {
	value []byte
	cas   uint32
}

// Get returns a value and its CAS; ok is false when it is missing. The
// value is shared and never written again (Set stores a new copy): callers
// copy it, as a host copies it into the guest, and write nothing into it.
func (d *SharedData) Get(key string) (value []byte, cas uint32, ok bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	e, ok := d.m[key]
	if !ok {
		return nil, 0, false
	}
	return e.value, e.cas, true
}

// Set writes a value and returns an ABI status. As in cpp-host, a non-zero
// CAS is checked against an existing entry only: on a missing key any CAS
// inserts.
func (d *SharedData) Set(key string, value []byte, cas uint32) abi.Status {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.m == nil {
		d.m = map[string]sharedEntry{}
	}
	if e, found := d.m[key]; found && cas != 0 && e.cas != cas {
		return abi.StatusCasMismatch
	}
	d.cas++
	d.m[key] = sharedEntry{value: append([]byte(nil), value...), cas: d.cas}
	return abi.StatusOK
}

// Metrics are the metrics a plugin defines, with Envoy's rules: a counter
// only grows, a histogram is only recorded. Safe for concurrent use.
type Metrics struct {
	mu     sync.Mutex
	byName map[string]uint32
	list   []metric
}

type metric struct {
	name   string
	kind   abi.MetricType
	value  int64
	values []uint64
}

// Define returns the id of a metric, defining it on first use.
func (ms *Metrics) Define(kind abi.MetricType, name string) (id uint32, status abi.Status) {
	if kind > abi.MetricHistogram || name == "" {
		return 0, abi.StatusBadArgument
	}
	ms.mu.Lock()
	defer ms.mu.Unlock()
	if ms.byName == nil {
		ms.byName = map[string]uint32{}
	}
	id, found := ms.byName[name]
	if !found {
		id = uint32(len(ms.list))
		ms.list = append(ms.list, metric{name: name, kind: kind})
		ms.byName[name] = id
	}
	return id, abi.StatusOK
}

// Increment adds to a counter or gauge. Envoy refuses a histogram, and a
// counter increment that would not make it grow.
func (ms *Metrics) Increment(id uint32, offset int64) abi.Status {
	return ms.update(id, func(mt *metric) bool {
		if mt.kind == abi.MetricHistogram || mt.kind == abi.MetricCounter && offset <= 0 {
			return false
		}
		mt.value += offset
		return true
	})
}

// Record adds a histogram sample; a counter or gauge takes the value.
func (ms *Metrics) Record(id uint32, value uint64) abi.Status {
	return ms.update(id, func(mt *metric) bool {
		if mt.kind == abi.MetricHistogram {
			if len(mt.values) < 1_000_000 {
				mt.values = append(mt.values, value)
			}
		} else {
			mt.value = int64(value)
		}
		return true
	})
}

// Get reads a counter's or gauge's value.
func (ms *Metrics) Get(id uint32) (int64, abi.Status) {
	var v int64
	st := ms.update(id, func(mt *metric) bool { v = mt.value; return mt.kind != abi.MetricHistogram })
	return v, st
}

// Value is a counter's or gauge's value by name (0 when undefined).
func (ms *Metrics) Value(name string) int64 {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	if id, ok := ms.byName[name]; ok {
		return ms.list[id].value
	}
	return 0
}

// Samples are a histogram's recorded values by name.
func (ms *Metrics) Samples(name string) []uint64 {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	if id, ok := ms.byName[name]; ok {
		return append([]uint64(nil), ms.list[id].values...)
	}
	return nil
}

func (ms *Metrics) update(id uint32, f func(*metric) bool) abi.Status {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	if int(id) >= len(ms.list) {
		return abi.StatusNotFound
	}
	if !f(&ms.list[id]) {
		return abi.StatusBadArgument
	}
	return abi.StatusOK
}
