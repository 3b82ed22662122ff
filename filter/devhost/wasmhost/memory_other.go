//go:build !linux

package wasmhost

import "github.com/tetratelabs/wazero/experimental"

// reservedMemory is wazero's own allocator off Linux (memory_linux.go).
var reservedMemory experimental.MemoryAllocator
