//go:build wasip1 && !tollgate_fakehost

package proxywasm

import (
	"runtime"
	_ "unsafe" // go:linkname
)

// Go's collector runs in the guest only where the binding calls it: at the
// end of a callback the host makes from its event loop, never from inside
// another callback. Left to itself, the collector starts in whatever
// allocates, proxy_on_memory_allocate included (called from inside a host
// call), and leans on its background goroutines, which a reactor runs
// only when the callback's goroutine blocks. Two failures follow, both
// measured under wazero (filtertest TestGCUnderHeldRequests):
//   - a cycle whose assists once parked waits for a background mark
//     worker that no longer runs: the cycle never ends, and the heap grows
//     by every request's garbage (200 MB after 200,000 requests);
//   - when the goroutines do run, the scavenger returns memory and sleeps
//     on a timer; a timer starts Go's poller, whose poll_oneoff Envoy 1.33
//     to 1.38 refuse, and Go throws at the next collection.
//
// So automatic collection is off (the runtime's own GOGC=off), and every
// callback from the event loop (all but proxy_on_memory_allocate) ends
// with a check: the heap is read every gcCheckEvery callbacks, a body
// chunk counting for its size too (one request's body can make garbage
// with no other callback in between), and collected when it has doubled
// since the last collection (4 MiB at least), the pacing GOGC=100 gives. With no
// automatic cycle there are no assists; runtime.GC runs the mark workers
// to the end inside the call; and the scavenger, paced against an unchanged
// goal, finds nothing to return, so it parks without a timer.

// setGCPercent and freeOSMemory are runtime/debug's SetGCPercent and
// FreeOSMemory, reached where the runtime provides them (it links both
// into runtime/debug by name): importing runtime/debug would link os,
// whose init opens descriptors and so starts the poller.
//
//go:linkname setGCPercent runtime/debug.setGCPercent
func setGCPercent(int32) int32

//go:linkname freeOSMemory runtime/debug.freeOSMemory
func freeOSMemory()

func init() { setGCPercent(-1) }

// minHeap is the heap the guest may reach before its first collection
// (Go's own minimum heap goal).
const minHeap = 4 << 20

// gcCheckEvery is how many callbacks pass between two reads of the heap's
// size: runtime.ReadMemStats stops the world (nothing, in a VM of one
// thread) and costs about 5 µs under wazero. A body chunk counts one more
// for every gcBodyBytes in it.
const (
	gcCheckEvery = 64
	gcBodyBytes  = 4 << 10
)

var (
	gcStats   runtime.MemStats
	gcNext    uint64 = minHeap
	gcPending uint32
)

// collectIfDue collects when the heap has passed its goal. Called only at
// the end of callbacks the host makes from its event loop, after their
// work returned (not deferred: a callback that panics traps the VM, and
// no collection should start while it unwinds).
func collectIfDue() { collectAfter(0) }

// collectAfterBody is collectIfDue after a body chunk of size bytes.
func collectAfterBody(size uint32) { collectAfter(size / gcBodyBytes) }

func collectAfter(extra uint32) {
	gcPending += 1 + extra
	if gcPending < gcCheckEvery {
		return
	}
	gcPending = 0
	runtime.ReadMemStats(&gcStats)
	if gcStats.HeapAlloc < gcNext {
		return
	}
	freeOSMemory()
	runtime.ReadMemStats(&gcStats)
	gcNext = max(2*gcStats.HeapAlloc, minHeap)
}
