// Package types holds the proxy-wasm ABI v0.2.1 types the filter uses, named
// as in the maintained proxy-wasm Go SDK's types package, so that moving to
// that SDK later is an import change.
package types

import "errors"

// Action is what a stream callback tells the host to do next.
type Action uint32

const (
	ActionContinue Action = 0
	ActionPause    Action = 1
)

// OnVMStartStatus and OnPluginStartStatus report whether start-up succeeded.
type (
	OnVMStartStatus     bool
	OnPluginStartStatus bool
)

const (
	OnVMStartStatusOK         OnVMStartStatus     = true
	OnVMStartStatusFailed     OnVMStartStatus     = false
	OnPluginStartStatusOK     OnPluginStartStatus = true
	OnPluginStartStatusFailed OnPluginStartStatus = false
)

// Errors of host calls, by ABI status.
var (
	ErrorStatusNotFound    = errors.New("error status returned by host: not found")
	ErrorStatusBadArgument = errors.New("error status returned by host: bad argument")
	ErrorStatusEmpty       = errors.New("error status returned by host: empty")
	ErrorStatusCasMismatch = errors.New("error status returned by host: cas mismatch")
	ErrorInternalFailure   = errors.New("error status returned by host: internal failure")
	ErrorUnimplemented     = errors.New("error status returned by host: unimplemented")
)

// VMContext is the per-VM context; one per Wasm VM (one per Envoy worker).
type VMContext interface {
	OnVMStart(vmConfigurationSize int) OnVMStartStatus
	NewPluginContext(contextID uint32) PluginContext
}

// PluginContext is the root context of one plugin configuration.
type PluginContext interface {
	OnPluginStart(pluginConfigurationSize int) OnPluginStartStatus
	OnPluginDone() bool
	OnTick()
	NewHttpContext(contextID uint32) HttpContext
}

// HttpContext is one HTTP stream. The body callbacks keep the SDK's shape,
// but this binding does not export them to the host (see exports_wasip1.go):
// they are never called.
type HttpContext interface {
	OnHttpRequestHeaders(numHeaders int, endOfStream bool) Action
	OnHttpRequestBody(bodySize int, endOfStream bool) Action
	OnHttpResponseHeaders(numHeaders int, endOfStream bool) Action
	OnHttpResponseBody(bodySize int, endOfStream bool) Action
	OnHttpStreamDone()
}

// DefaultVMContext, DefaultPluginContext and DefaultHttpContext implement
// every callback as a no-op; embed them and override what you need.
type (
	DefaultVMContext     struct{}
	DefaultPluginContext struct{}
	DefaultHttpContext   struct{}
)

func (DefaultVMContext) OnVMStart(int) OnVMStartStatus              { return OnVMStartStatusOK }
func (DefaultVMContext) NewPluginContext(uint32) PluginContext      { return &DefaultPluginContext{} }
func (*DefaultPluginContext) OnPluginStart(int) OnPluginStartStatus { return OnPluginStartStatusOK }
func (*DefaultPluginContext) OnPluginDone() bool                    { return true }
func (*DefaultPluginContext) OnTick()                               {}
func (*DefaultPluginContext) NewHttpContext(uint32) HttpContext     { return &DefaultHttpContext{} }
func (*DefaultHttpContext) OnHttpRequestHeaders(int, bool) Action   { return ActionContinue }
func (*DefaultHttpContext) OnHttpRequestBody(int, bool) Action      { return ActionContinue }
func (*DefaultHttpContext) OnHttpResponseHeaders(int, bool) Action  { return ActionContinue }
func (*DefaultHttpContext) OnHttpResponseBody(int, bool) Action     { return ActionContinue }
func (*DefaultHttpContext) OnHttpStreamDone()                       {}
