package wasmhost

import (
	"context"
	"errors"
	"fmt"
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
	id := s.ID
	vm.streams[id] = s
	if _, err := vm.call(ctx, vm.fn.contextCreate, uint64(id), uint64(vm.rootID)); err != nil {
		return nil, err
	}
	return s, nil
}

// LowerKeys copies h with lower-case keys.
func LowerKeys(h Headers) Headers {
	out := make(Headers, len(h))
	for i, kv := range h {
		out[i] = [2]string{strings.ToLower(kv[0]), kv[1]}
	}
	return out
}

// OnRequestHeaders runs proxy_on_request_headers. If the guest answered
// locally, the answer's headers then pass the filter's response path, as in
// Envoy, before this returns.
func (s *Stream) OnRequestHeaders(ctx context.Context, endOfStream bool) (Action, error) {
	s.vm.Enter(s.ID)
	r, err := s.vm.call(ctx, s.vm.fn.requestHeaders, uint64(s.ID), uint64(len(s.RequestHeaders)), b2u(endOfStream))
	if err != nil {
		return Continue, err
	}
	if Action(r) == Continue {
		s.requestSent = true
	}
	return Action(r), s.finishLocal(ctx)
}

// OnResponseHeaders runs proxy_on_response_headers with the upstream's headers.
func (s *Stream) OnResponseHeaders(ctx context.Context, headers Headers, endOfStream bool) (Action, error) {
	s.ResponseHeaders = LowerKeys(headers)
	s.vm.Enter(s.ID)
	r, err := s.vm.call(ctx, s.vm.fn.responseHeaders, uint64(s.ID), uint64(len(s.ResponseHeaders)), b2u(endOfStream))
	return Action(r), err
}

// finishLocal sends a pending local reply through the response path.
func (s *Stream) finishLocal(ctx context.Context) error {
	if s.Local == nil || s.ResponseHeaders != nil {
		return nil
	}
	s.ResponseHeaders = append(Headers{{":status", fmt.Sprint(s.Local.Status)}}, s.Local.Headers...)
	s.vm.Enter(s.ID)
	if _, err := s.vm.call(ctx, s.vm.fn.responseHeaders, uint64(s.ID), uint64(len(s.ResponseHeaders)), 0); err != nil {
		return err
	}
	s.Local.Headers = s.ResponseHeaders[1:]
	return nil
}

// Done ends the stream: proxy_on_done, proxy_on_log, proxy_on_delete.
func (s *Stream) Done(ctx context.Context) error {
	if s.done {
		return nil
	}
	s.done = true
	vm := s.vm
	vm.Enter(s.ID)
	var errs []error
	for _, f := range []func() error{
		func() error { _, err := vm.call(ctx, vm.fn.done, uint64(s.ID)); return err },
		func() error { _, err := vm.call(ctx, vm.fn.log, uint64(s.ID)); return err },
		func() error { _, err := vm.call(ctx, vm.fn.del, uint64(s.ID)); return err },
	} {
		errs = append(errs, f())
	}
	delete(vm.streams, s.ID)
	vm.CloseStream(s.ID) // its callouts stay (see Core.CloseStream)
	return errors.Join(errs...)
}

// Callout is an HTTP call the guest dispatched (proxy_http_call).
type Callout struct {
	Token     uint32
	ContextID uint32
	Cluster   string
	Headers   Headers
	Body      []byte
	Timeout   uint32 // ms
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
	c, ok := vm.TakeCallout(token, &resp)
	if !ok {
		return fmt.Errorf("no pending callout %d", token)
	}
	defer vm.Delivered()
	if _, err := vm.call(ctx, vm.fn.callResponse, uint64(vm.rootID), uint64(token), uint64(len(resp.Headers)), uint64(len(resp.Body)), 0); err != nil {
		return err
	}
	if s, ok := vm.streams[c.ContextID]; ok {
		return s.finishLocal(ctx)
	}
	return nil
}

// Fail delivers a failed callout the way Envoy reports a reset stream or a
// connection failure: a response with no headers and no body.
func (vm *VM) Fail(ctx context.Context, token uint32) error {
	return vm.Respond(ctx, token, CalloutResponse{})
}

func b2u(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}
