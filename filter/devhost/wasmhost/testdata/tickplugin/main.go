// Command tickplugin is a test module for wasmhost: it asks for a tick at
// start and counts the ticks it gets in a metric. With the plugin
// configuration "sleep" it also sleeps on every tick, which makes Go's
// runtime call poll_oneoff (the call Envoy 1.33 to 1.38 answer with ENOSYS).
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
	ticks proxywasm.MetricCounter
	sleep bool
}

func (p *plugin) OnPluginStart(int) types.OnPluginStartStatus {
	cfg, _ := proxywasm.GetPluginConfiguration()
	p.sleep = string(cfg) == "sleep"
	p.ticks = proxywasm.DefineCounterMetric("ticks")
	if err := proxywasm.SetTickPeriodMilliSeconds(250); err != nil {
		return types.OnPluginStartStatusFailed
	}
	return types.OnPluginStartStatusOK
}

func (p *plugin) OnTick() {
	if p.sleep {
		time.Sleep(time.Millisecond)
	}
	p.ticks.Increment(1)
}
