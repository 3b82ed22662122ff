// Package hostmodel is the proxy-wasm host (ABI v0.2.1) as Envoy behaves,
// modelled once: streams and the effective context, header maps, callouts
// in flight and their delivery, local replies that pass the response path,
// properties, shared data with CAS, metrics and ticks. It knows nothing of
// Wasm. Two fronts drive it: proxytest runs the guest natively against it
// (its Core is the binding's NativeHost), and devhost/wasmhost runs the
// compiled module under wazero and turns guest memory into its calls, so
// the unit tests and the module's tests see the same semantics.
package hostmodel
