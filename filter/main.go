// Command tollgate is the Tollgate proxy-wasm filter: the guest that ships
// in Envoy. Build it with GOOS=wasip1 GOARCH=wasm go build
// -buildmode=c-shared: the host calls _initialize (which runs init) and
// never main.
//
// The module holds three parts, and the folders say which is which:
//   - the guest: this package, internal/ (plugin, jwt, leasecache, fallback)
//     and pluginconf (the plugin configuration, public so that Envoy
//     configs can be checked against it);
//   - the binding: proxywasm/ (the ABI, its numbers in abi, header maps in
//     headermap), with hostmodel (Envoy's host semantics as a model) and
//     proxytest (the guest run natively against that model);
//   - the development host: devhost/ (wasmhost runs the compiled module
//     under wazero on hostmodel; gateway and cmd/tollgate-gateway serve
//     HTTP through it for make run, tests and benchmarks).
//
// Imports go one way: the guest imports the binding; the binding imports
// neither; proxytest imports hostmodel; devhost imports hostmodel. No guest
// or binding package imports devhost (layout_test.go holds this).
package main

import (
	"github.com/tollgate-rl/tollgate/filter/internal/plugin"
	"github.com/tollgate-rl/tollgate/filter/proxywasm"
)

func init() { proxywasm.SetVMContext(plugin.VM{}) }

func main() {}
