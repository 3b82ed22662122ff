//go:build linux

package wasmhost

import (
	"syscall"

	"github.com/tetratelabs/wazero/experimental"
)

// reservedMemory backs each VM's linear memory with one anonymous mapping
// of the memory's maximum, reserved and never moved, as V8 reserves a
// Wasm32 memory in Envoy: memory.grow only lengthens the slice. wazero's
// default grows a Go slice by appending, copying the whole memory at every
// step while a fresh VM's heap settles (a tenth of a gateway benchmark
// round's filter time). Pages are touched, and so resident, only once the
// guest writes them.
var reservedMemory experimental.MemoryAllocator = experimental.MemoryAllocatorFunc(func(_, max uint64) experimental.LinearMemory {
	buf, err := syscall.Mmap(-1, 0, int(max), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANONYMOUS|syscall.MAP_NORESERVE)
	if err != nil {
		// No address space for it: a Go slice, grown by copying.
		return &mapping{max: max, heap: true}
	}
	return &mapping{buf: buf, max: max}
})

// mapping is a reserved linear memory; heap says it is a Go slice (the
// mapping failed), which Free leaves to the garbage collector.
type mapping struct {
	buf  []byte
	max  uint64
	heap bool
}

// Reallocate answers the memory at size bytes; nil (memory.grow fails) past
// the maximum.
func (m *mapping) Reallocate(size uint64) []byte {
	if size > m.max {
		return nil
	}
	if m.heap && size > uint64(cap(m.buf)) {
		m.buf = append(m.buf[:cap(m.buf)], make([]byte, size-uint64(cap(m.buf)))...)
	}
	return m.buf[:size]
}

func (m *mapping) Free() {
	if m.buf != nil && !m.heap {
		_ = syscall.Munmap(m.buf[:cap(m.buf)])
	}
	m.buf = nil
}
