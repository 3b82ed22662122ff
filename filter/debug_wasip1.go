//go:build wasip1

package main

import "runtime/metrics"

// allocSamples are read by tollgate_debug_allocs; allocated once so that
// reading them allocates nothing.
var allocSamples = []metrics.Sample{{Name: "/gc/heap/allocs:objects"}, {Name: "/gc/heap/tiny/allocs:objects"}}

// debugAllocs is the cumulative count of heap objects the module has
// allocated (tiny objects included, which /gc/heap/allocs:objects leaves out).
// Only the benchmarks call it, to report guest allocations per request; Envoy
// never does. runtime/metrics does not stop the world, but the runtime
// publishes a span's allocations when the span is refilled, so a reading lags
// by at most a span per size class: benchmarks read it over thousands of
// requests.
//
//go:wasmexport tollgate_debug_allocs
func debugAllocs() uint64 {
	metrics.Read(allocSamples)
	return allocSamples[0].Value.Uint64() + allocSamples[1].Value.Uint64()
}

// gcSamples is read by tollgate_debug_gc_cycles.
var gcSamples = []metrics.Sample{{Name: "/gc/cycles/total:gc-cycles"}}

// debugGCCycles is the number of garbage collections the module has run: the
// soak tests read it to show the VM lived through many (under Envoy 1.33 to
// 1.38 a Go module that had started its poller died at the next one). Envoy
// never calls it.
//
//go:wasmexport tollgate_debug_gc_cycles
func debugGCCycles() uint64 {
	metrics.Read(gcSamples)
	return gcSamples[0].Value.Uint64()
}
