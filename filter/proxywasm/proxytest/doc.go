// Package proxytest runs a plugin natively against a Go host with the same
// semantics as wasmhost (header maps, callouts, local replies that pass the
// response path, shared data with CAS), for unit tests and for benchmarks of
// the plugin's own logic without Wasm. The binding keeps its contexts in
// package state, so one Host runs at a time.
//
// Outside wasip1 only: inside Wasm the real host is there.
package proxytest
