// Command tickplugin is a test module for wasmhost's timers: it asks for a
// tick at start and counts the ticks it gets in a metric.
package main

import (
	"github.com/tollgate-rl/tollgate/filter/proxywasm"
	"github.com/tollgate-rl/tollgate/filter/proxywasm/types"
)

func init() { proxywasm.SetVMContext(vm{}) }

func main() {}

type vm struct{ types.DefaultVMContext }

func (vm) NewPluginContext(uint32) types.PluginContext { return &plugin{} }

type plugin struct {
	types.DefaultPluginContext
	ticks proxywasm.MetricCounter
}

func (p *plugin) OnPluginStart(int) types.OnPluginStartStatus {
	p.ticks = proxywasm.DefineCounterMetric("ticks")
	if err := proxywasm.SetTickPeriodMilliSeconds(250); err != nil {
		return types.OnPluginStartStatusFailed
	}
	return types.OnPluginStartStatusOK
}

func (p *plugin) OnTick() { p.ticks.Increment(1) }
