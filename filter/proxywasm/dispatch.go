// Package proxywasm is Tollgate's binding of proxy-wasm ABI v0.2.1 for the
// standard Go toolchain (GOOS=wasip1, -buildmode=c-shared). Its exported
// functions carry the names and signatures of the maintained proxy-wasm Go
// SDK's proxywasm package, for the calls the filter uses.
//
// A Wasm VM is single-threaded: the host calls one callback at a time, so the
// state here needs no locks.
package proxywasm

import "github.com/tollgate-rl/tollgate/filter/proxywasm/types"

type pluginState struct {
	ctx      types.PluginContext
	callouts idTable[callout]
}

type callout struct {
	contextID uint32 // the context that dispatched it, made effective again
	// The answer goes to recv (with kind) or, without one, to cb.
	recv CalloutReceiver
	kind uint8
	cb   func(numHeaders, bodySize, numTrailers int)
}

// CalloutReceiver gets the answer of a callout dispatched with
// DispatchHttpCallTo, with the kind it was given: a context that makes
// several kinds of callout is one receiver, where a method value per
// callout would be an allocation each.
type CalloutReceiver interface {
	OnCalloutResponse(kind uint8, numHeaders, bodySize, numTrailers int)
}

type httpState struct {
	ctx    types.HttpContext
	rootID uint32
}

var (
	vmContext types.VMContext = types.DefaultVMContext{}
	plugins                   = map[uint32]*pluginState{}
	// streams holds its states by value: a new stream costs no allocation
	// of its own here.
	streams = newIDTable[httpState]()
	// activeID is the context whose callback runs now; DispatchHttpCall
	// remembers it so the response runs in the same context.
	activeID uint32
)

// SetVMContext installs the VM context; call it from init().
func SetVMContext(ctx types.VMContext) { vmContext = ctx }

func onVMStart(rootID, vmConfigSize uint32) bool {
	activeID = rootID
	return bool(vmContext.OnVMStart(int(vmConfigSize)))
}

func onConfigure(rootID, pluginConfigSize uint32) bool {
	p, ok := plugins[rootID]
	if !ok {
		return false
	}
	activeID = rootID
	return bool(p.ctx.OnPluginStart(int(pluginConfigSize)))
}

func onContextCreate(contextID, parentID uint32) {
	if parentID == 0 {
		plugins[contextID] = &pluginState{ctx: vmContext.NewPluginContext(contextID), callouts: newIDTable[callout]()}
		return
	}
	p, ok := plugins[parentID]
	if !ok {
		return
	}
	if h := p.ctx.NewHttpContext(contextID); h != nil {
		streams.put(contextID, httpState{ctx: h, rootID: parentID})
	}
}

func onRequestHeaders(contextID, numHeaders uint32, end bool) uint32 {
	return onStream(contextID, func(h types.HttpContext) types.Action { return h.OnHttpRequestHeaders(int(numHeaders), end) })
}

func onResponseHeaders(contextID, numHeaders uint32, end bool) uint32 {
	return onStream(contextID, func(h types.HttpContext) types.Action { return h.OnHttpResponseHeaders(int(numHeaders), end) })
}

func onRequestBody(contextID, bodySize uint32, end bool) uint32 {
	return onStream(contextID, func(h types.HttpContext) types.Action { return h.OnHttpRequestBody(int(bodySize), end) })
}

func onResponseBody(contextID, bodySize uint32, end bool) uint32 {
	return onStream(contextID, func(h types.HttpContext) types.Action { return h.OnHttpResponseBody(int(bodySize), end) })
}

// onStream runs a stream callback with its context active; a stream the
// plugin made no context for continues.
func onStream(contextID uint32, callback func(types.HttpContext) types.Action) uint32 {
	h, ok := streams.get(contextID)
	if !ok {
		return uint32(types.ActionContinue)
	}
	activeID = contextID
	return uint32(callback(h.ctx))
}

func onHttpCallResponse(rootID, token, numHeaders, bodySize, numTrailers uint32) {
	p, ok := plugins[rootID]
	if !ok {
		return
	}
	c, ok := p.callouts.get(token)
	if !ok {
		return
	}
	p.callouts.remove(token)
	// The answer arrives on the root context; the request it belongs to must
	// be made effective before its headers are touched or it is resumed.
	// Envoy delivers an answer even after its stream ended (the callout
	// belongs to the root context): the callback still runs, to keep what
	// the answer brought (a lease, a breaker outcome), with the root context
	// effective.
	activeID = rootID
	if _, live := streams.get(c.contextID); live && c.contextID != rootID {
		proxySetEffectiveContext(c.contextID)
		activeID = c.contextID
	}
	if c.recv != nil {
		c.recv.OnCalloutResponse(c.kind, int(numHeaders), int(bodySize), int(numTrailers))
		return
	}
	c.cb(int(numHeaders), int(bodySize), int(numTrailers))
}

func onTick(rootID uint32) {
	if p, ok := plugins[rootID]; ok {
		activeID = rootID
		p.ctx.OnTick()
	}
}

// onDone is proxy_on_done's, for the native binding: the module exports
// no proxy_on_done (a VM call per stream for nothing; a context without
// one is done at once, as the plugin's always are).
func onDone(contextID uint32) bool {
	if p, ok := plugins[contextID]; ok {
		return p.ctx.OnPluginDone()
	}
	return true
}

func onDelete(contextID uint32) {
	if h, ok := streams.get(contextID); ok {
		activeID = contextID
		h.ctx.OnHttpStreamDone()
		streams.remove(contextID)
		return
	}
	delete(plugins, contextID)
}
