// Package devhost groups the development host: wasmhost runs the compiled
// filter under wazero on the binding's host model (proxywasm/hostmodel),
// gateway serves HTTP through it, and cmd/tollgate-gateway is the command
// make run starts. Envoy is the production host; nothing in the guest or
// the binding imports this tree.
package devhost
