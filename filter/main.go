// Command tollgate is the Tollgate proxy-wasm filter. Build it with
// GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared: the host calls
// _initialize (which runs init) and never main.
package main

import (
	"github.com/tollgate-rl/tollgate/filter/internal/plugin"
	"github.com/tollgate-rl/tollgate/filter/proxywasm"
)

func init() { proxywasm.SetVMContext(plugin.VM{}) }

func main() {}
