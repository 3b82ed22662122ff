// Command sleepplugin is a test module for wasmhost's Envoy WASI: on every
// tick it sleeps, which makes Go's runtime call poll_oneoff, the call that
// Envoy 1.33 to 1.38 answers with ENOSYS.
package main

import (
	"time"

	"github.com/tollgate-rl/tollgate/filter/proxywasm"
	"github.com/tollgate-rl/tollgate/filter/proxywasm/types"
)

func init() { proxywasm.SetVMContext(vm{}) }

func main() {}

type vm struct{ types.DefaultVMContext }

func (vm) NewPluginContext(uint32) types.PluginContext { return &plugin{} }

type plugin struct {
	types.DefaultPluginContext
	slept proxywasm.MetricCounter
}

func (p *plugin) OnPluginStart(int) types.OnPluginStartStatus {
	p.slept = proxywasm.DefineCounterMetric("slept")
	if err := proxywasm.SetTickPeriodMilliSeconds(100); err != nil {
		return types.OnPluginStartStatusFailed
	}
	return types.OnPluginStartStatusOK
}

func (p *plugin) OnTick() {
	time.Sleep(time.Millisecond)
	p.slept.Increment(1)
}
