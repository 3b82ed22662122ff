//go:build wasip1

package main

import "runtime"

// memStats is read by the debug exports; kept so that reading allocates
// nothing. runtime.ReadMemStats stops the world, which in a VM of one
// thread costs nothing more, and links far less than runtime/metrics (its
// tables of metrics and their descriptions: 22 kB of module).
var memStats runtime.MemStats

// debugAllocs is the cumulative count of heap objects the module has
// allocated (tiny objects included). Only the benchmarks call it, to report
// guest allocations per request; Envoy never does.
//
//go:wasmexport tollgate_debug_allocs
func debugAllocs() uint64 {
	runtime.ReadMemStats(&memStats)
	return memStats.Mallocs
}

// debugGCCycles is the number of garbage collections the module has run: the
// soak tests read it to show the VM lived through many (under Envoy 1.33 to
// 1.38 a Go module that had started its poller died at the next one). Envoy
// never calls it.
//
//go:wasmexport tollgate_debug_gc_cycles
func debugGCCycles() uint64 {
	runtime.ReadMemStats(&memStats)
	return uint64(memStats.NumGC)
}
