package wasmhost

import (
	"context"

	"github.com/tollgate-rl/tollgate/filter/proxywasm/hostmodel"
)

// The host model's types, as this host's API presents them.
type (
	Action          = hostmodel.Action
	Headers         = hostmodel.Headers
	LocalResponse   = hostmodel.LocalResponse
	Callout         = hostmodel.Callout
	CalloutResponse = hostmodel.CalloutResponse
	StreamState     = hostmodel.StreamState
	Core            = hostmodel.Core
	Guest           = hostmodel.Guest
	SharedData      = hostmodel.SharedData
	Metrics         = hostmodel.Metrics
	LogLine         = hostmodel.LogLine
)

// What a stream callback answered.
const (
	Continue = hostmodel.Continue
	Pause    = hostmodel.Pause
)

// LowerKeys copies h with lower-case keys (hostmodel.LowerKeys).
func LowerKeys(h Headers) Headers { return hostmodel.LowerKeys(h) }

// Stream is one HTTP request through the filter.
type Stream struct {
	*StreamState
	vm   *VM
	done bool
}

// NewStream creates an HTTP context. Request headers should carry :method,
// :path, :authority and :scheme, as Envoy's do.
func (vm *VM) NewStream(ctx context.Context, req Headers, props map[string]string) (*Stream, error) {
	s := &Stream{StreamState: vm.OpenStream(req, props), vm: vm}
	if _, err := vm.call(vm.fn.contextCreate, uint64(s.ID), uint64(vm.RootID())); err != nil {
		return nil, err
	}
	return s, nil
}

// guest is the VM's compiled module as the Core's Guest.
func (s *Stream) guest(context.Context) Guest { return wasmGuest{s.vm} }

// OnRequestHeaders runs proxy_on_request_headers. If the guest answered
// locally, the answer's headers then pass the filter's response path, as in
// Envoy, before this returns.
func (s *Stream) OnRequestHeaders(ctx context.Context, endOfStream bool) (Action, error) {
	return s.vm.RequestHeaders(s.guest(ctx), s.StreamState, endOfStream)
}

// OnResponseHeaders runs proxy_on_response_headers with the upstream's headers.
func (s *Stream) OnResponseHeaders(ctx context.Context, headers Headers, endOfStream bool) (Action, error) {
	return s.vm.ResponseHeaders(s.guest(ctx), s.StreamState, headers, endOfStream)
}

// OnRequestBody runs proxy_on_request_body with a chunk of the client's
// body (Core.RequestBody): released is what goes on upstream.
func (s *Stream) OnRequestBody(ctx context.Context, chunk []byte, endOfStream bool) (Action, []byte, error) {
	return s.vm.RequestBody(s.guest(ctx), s.StreamState, chunk, endOfStream)
}

// OnResponseBody runs proxy_on_response_body with a chunk of the upstream's
// body (Core.ResponseBody): released is what goes on to the client.
func (s *Stream) OnResponseBody(ctx context.Context, chunk []byte, endOfStream bool) (Action, []byte, error) {
	return s.vm.ResponseBody(s.guest(ctx), s.StreamState, chunk, endOfStream)
}

// Done ends the stream: proxy_on_done, proxy_on_log, proxy_on_delete.
func (s *Stream) Done(ctx context.Context) error {
	if s.done {
		return nil
	}
	s.done = true
	return s.vm.EndStream(s.guest(ctx), s.StreamState) // its callouts stay (see Core.CloseStream)
}

// Respond delivers a callout's answer: proxy_on_http_call_response on the
// root context, after which the guest reads it. A stream it paused and then
// answered locally passes its response path too.
func (vm *VM) Respond(ctx context.Context, token uint32, resp CalloutResponse) error {
	return vm.Deliver(wasmGuest{vm}, token, resp)
}

// Fail delivers a failed callout the way Envoy reports a reset stream or a
// connection failure: a response with no headers and no body.
func (vm *VM) Fail(ctx context.Context, token uint32) error {
	return vm.Respond(ctx, token, CalloutResponse{})
}
