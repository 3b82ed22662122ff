// Command tickplugin is a test module for wasmhost: it asks for a tick at
// start and counts the ticks it gets in a metric. With the plugin
// configuration "sleep" it also sleeps on every tick, which makes Go's
// runtime call poll_oneoff (the call Envoy 1.33 to 1.38 answer with ENOSYS).
// With "rearm" it asks for a tick an hour at start and for one every
// millisecond once a request comes: a host must tick it soon after (Envoy's
// setTickPeriod re-arms its timer at once).
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
	ticks        proxywasm.MetricCounter
	sleep, rearm bool
}

func (p *plugin) OnPluginStart(int) types.OnPluginStartStatus {
	cfg, _ := proxywasm.GetPluginConfiguration()
	p.sleep, p.rearm = string(cfg) == "sleep", string(cfg) == "rearm"
	p.ticks = proxywasm.DefineCounterMetric("ticks")
	period := uint32(250)
	if p.rearm {
		period = 3_600_000
	}
	if err := proxywasm.SetTickPeriodMilliSeconds(period); err != nil {
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

func (p *plugin) NewHttpContext(uint32) types.HttpContext { return &stream{rearm: p.rearm} }

type stream struct {
	types.DefaultHttpContext
	rearm bool
}

func (s *stream) OnHttpRequestHeaders(int, bool) types.Action {
	if s.rearm {
		_ = proxywasm.SetTickPeriodMilliSeconds(1)
	}
	return types.ActionContinue
}
