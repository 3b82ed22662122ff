package wasmhost

import (
	"context"
	"strings"
)

// Action is what a stream callback answered.
type Action uint32

const (
	Continue Action = 0
	Pause    Action = 1
)

// Headers is a header map: ordered pairs, keys compared without case, as
// Envoy keeps them (lower case, pseudo-headers first).
type Headers [][2]string

// Get returns the first value of key.
func (h Headers) Get(key string) (string, bool) {
	for _, kv := range h {
		if strings.EqualFold(kv[0], key) {
			return kv[1], true
		}
	}
	return "", false
}

// Value is Get without the flag.
func (h Headers) Value(key string) string { v, _ := h.Get(key); return v }

// Values returns every value of key.
func (h Headers) Values(key string) []string {
	var out []string
	for _, kv := range h {
		if strings.EqualFold(kv[0], key) {
			out = append(out, kv[1])
		}
	}
	return out
}

// Remove deletes every value of key.
func (h *Headers) Remove(key string) {
	out := (*h)[:0]
	for _, kv := range *h {
		if !strings.EqualFold(kv[0], key) {
			out = append(out, kv)
		}
	}
	*h = out
}

// Add appends a value (key lower-cased, as Envoy stores it).
func (h *Headers) Add(key, value string) { *h = append(*h, [2]string{strings.ToLower(key), value}) }

// Replace sets the first value of key in place, or adds it. Like Envoy's
// setCopy (what proxy_replace_header_map_value calls), it leaves any later
// values of key alone: a filter that needs one value must remove the others.
func (h *Headers) Replace(key, value string) {
	for i, kv := range *h {
		if strings.EqualFold(kv[0], key) {
			(*h)[i][1] = value
			return
		}
	}
	h.Add(key, value)
}

// LocalResponse is an answer the guest sent itself (proxy_send_local_response).
type LocalResponse struct {
	Status  int
	Headers Headers
	Body    []byte
}

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
	if _, err := vm.call(ctx, vm.fn.contextCreate, uint64(s.ID), uint64(vm.rootID)); err != nil {
		return nil, err
	}
	return s, nil
}

// LowerKeys copies h with lower-case keys, with room for the headers a
// filter typically adds (Envoy's header maps grow in place too).
func LowerKeys(h Headers) Headers {
	out := make(Headers, len(h), len(h)+8)
	for i, kv := range h {
		out[i] = [2]string{strings.ToLower(kv[0]), kv[1]}
	}
	return out
}

// guest is the VM's compiled module as the Core's Guest.
func (s *Stream) guest(ctx context.Context) Guest { return wasmGuest{ctx, s.vm} }

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

// Done ends the stream: proxy_on_done, proxy_on_log, proxy_on_delete.
func (s *Stream) Done(ctx context.Context) error {
	if s.done {
		return nil
	}
	s.done = true
	return s.vm.EndStream(s.guest(ctx), s.StreamState) // its callouts stay (see Core.CloseStream)
}

// Callout is an HTTP call the guest dispatched (proxy_http_call).
type Callout struct {
	Token     uint32
	ContextID uint32
	Cluster   string
	Headers   Headers
	Body      []byte
	TimeoutMs uint32
}

// CalloutResponse is a callout's answer.
type CalloutResponse struct {
	Headers Headers // with ":status"
	Body    []byte
}

// Respond delivers a callout's answer: proxy_on_http_call_response on the
// root context, after which the guest reads it. A stream it paused and then
// answered locally passes its response path too.
func (vm *VM) Respond(ctx context.Context, token uint32, resp CalloutResponse) error {
	return vm.Deliver(wasmGuest{ctx, vm}, token, resp)
}

// Fail delivers a failed callout the way Envoy reports a reset stream or a
// connection failure: a response with no headers and no body.
func (vm *VM) Fail(ctx context.Context, token uint32) error {
	return vm.Respond(ctx, token, CalloutResponse{})
}
