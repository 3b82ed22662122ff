//go:build !wasip1

// Package proxytest runs a plugin natively against wasmhost's host model (the
// same Core the wazero host uses), for fast unit tests and for comparing the
// plugin's native cost with its cost under Wasm. It is the model's native
// front: proxywasm.SetNativeHost points the binding at the Core.
package proxytest

import (
	"errors"
	"fmt"
	"strings"

	"github.com/tollgate-rl/tollgate/filter/proxywasm"
	"github.com/tollgate-rl/tollgate/filter/proxywasm/types"
	"github.com/tollgate-rl/tollgate/filter/wasmhost"
)

// Host is a native stand-in for Envoy: the host model, driven natively.
type Host struct {
	*wasmhost.Core
	metrics *wasmhost.Metrics
}

var _ proxywasm.NativeHost = (*wasmhost.Core)(nil)

// New starts vm with the plugin configuration; clusters are the names
// callouts may use.
func New(vm types.VMContext, pluginConfig []byte, clusters ...string) (*Host, error) {
	metrics := &wasmhost.Metrics{}
	h := &Host{Core: wasmhost.NewCore(wasmhost.CoreOptions{PluginConfig: pluginConfig, Clusters: clusters, Metrics: metrics}), metrics: metrics}
	proxywasm.SetVMContext(vm)
	proxywasm.SetNativeHost(h.Core)
	root := h.RootID()
	proxywasm.Native.ContextCreate(root, 0)
	if !proxywasm.Native.VMStart(root, 0) || !proxywasm.Native.Configure(root, uint32(len(pluginConfig))) {
		var msgs []string
		for _, l := range h.Logs() {
			msgs = append(msgs, l.Msg)
		}
		return nil, fmt.Errorf("plugin start failed: %s", strings.Join(msgs, "; "))
	}
	return h, nil
}

// Stream is one HTTP request.
type Stream struct {
	*wasmhost.StreamState
	h *Host
}

// NewStream creates an HTTP context.
func (h *Host) NewStream(req wasmhost.Headers, props map[string]string) *Stream {
	s := &Stream{StreamState: h.OpenStream(req, props), h: h}
	proxywasm.Native.ContextCreate(s.ID, h.RootID())
	return s
}

// OnRequestHeaders runs the request-headers callback; a local reply then
// passes the response path, as in Envoy.
func (s *Stream) OnRequestHeaders(end bool) wasmhost.Action {
	s.h.Enter(s.ID)
	a := wasmhost.Action(proxywasm.Native.RequestHeaders(s.ID, uint32(len(s.RequestHeaders)), end))
	if a == wasmhost.Continue {
		s.h.MarkSent(s.ID)
	}
	s.finishLocal()
	return a
}

// OnResponseHeaders runs the response-headers callback.
func (s *Stream) OnResponseHeaders(headers wasmhost.Headers, end bool) wasmhost.Action {
	s.ResponseHeaders = wasmhost.LowerKeys(headers)
	s.h.Enter(s.ID)
	return wasmhost.Action(proxywasm.Native.ResponseHeaders(s.ID, uint32(len(s.ResponseHeaders)), end))
}

func (s *Stream) finishLocal() {
	if s.Local == nil || s.ResponseHeaders != nil {
		return
	}
	s.ResponseHeaders = append(wasmhost.Headers{{":status", fmt.Sprint(s.Local.Status)}}, s.Local.Headers...)
	s.h.Enter(s.ID)
	proxywasm.Native.ResponseHeaders(s.ID, uint32(len(s.ResponseHeaders)), false)
	s.Local.Headers = s.ResponseHeaders[1:]
}

// Done ends the stream; its callouts stay, as in Envoy.
func (s *Stream) Done() {
	s.h.Enter(s.ID)
	proxywasm.Native.Done(s.ID)
	proxywasm.Native.Delete(s.ID)
	s.h.CloseStream(s.ID)
}

// Respond delivers a callout's answer (no headers: a reset).
func (h *Host) Respond(token uint32, resp wasmhost.CalloutResponse) error {
	c, ok := h.TakeCallout(token, &resp)
	if !ok {
		return errors.New("no such callout")
	}
	defer h.Delivered()
	root := h.RootID()
	proxywasm.Native.HttpCallResponse(root, token, uint32(len(resp.Headers)), uint32(len(resp.Body)), 0)
	if st, ok := h.Stream(c.ContextID); ok {
		(&Stream{StreamState: st, h: h}).finishLocal()
	}
	return nil
}

// Counter returns a metric's value.
func (h *Host) Counter(name string) int64 { return h.metrics.Value(name) }
