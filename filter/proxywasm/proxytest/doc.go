// Package proxytest runs a plugin natively against the binding's host model
// (proxywasm/hostmodel, the same Core the wazero host uses): header maps,
// callouts, local replies that pass the response path, shared data with
// CAS. It serves fast unit tests and comparisons of the plugin's native
// cost with its cost under Wasm. It is the model's native front:
// proxywasm.SetNativeHost points the binding at the Core. The binding keeps
// its contexts in package state, so one Host runs at a time.
//
// Outside wasip1 only: inside Wasm the real host is there.
package proxytest
