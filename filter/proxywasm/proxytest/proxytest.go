//go:build !wasip1 || tollgate_fakehost

package proxytest

import (
	"fmt"
	"strings"

	"github.com/tollgate-rl/tollgate/filter/proxywasm"
	"github.com/tollgate-rl/tollgate/filter/proxywasm/hostmodel"
	"github.com/tollgate-rl/tollgate/filter/proxywasm/types"
)

// Host is a native stand-in for Envoy: the host model, driven natively.
type Host struct {
	*hostmodel.Core
	metrics *hostmodel.Metrics
}

var _ proxywasm.NativeHost = (*hostmodel.Core)(nil)

// New starts vm with the plugin configuration; clusters are the names
// callouts may use.
func New(vm types.VMContext, pluginConfig []byte, clusters ...string) (*Host, error) {
	metrics := &hostmodel.Metrics{}
	h := &Host{Core: hostmodel.NewCore(hostmodel.CoreOptions{PluginConfig: pluginConfig, Clusters: clusters, Metrics: metrics}), metrics: metrics}
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
	*hostmodel.StreamState
	h *Host
}

// NewStream creates an HTTP context.
func (h *Host) NewStream(req hostmodel.Headers, props map[string]string) *Stream {
	s := &Stream{StreamState: h.OpenStream(req, props), h: h}
	proxywasm.Native.ContextCreate(s.ID, h.RootID())
	return s
}

// OnRequestHeaders runs the request-headers callback; a local reply then
// passes the response path, as in Envoy.
func (s *Stream) OnRequestHeaders(end bool) hostmodel.Action {
	a, _ := s.h.RequestHeaders(native{}, s.StreamState, end)
	return a
}

// OnResponseHeaders runs the response-headers callback.
func (s *Stream) OnResponseHeaders(headers hostmodel.Headers, end bool) hostmodel.Action {
	a, _ := s.h.ResponseHeaders(native{}, s.StreamState, headers, end)
	return a
}

// OnRequestBody passes a chunk of the request body (Core.RequestBody). It
// panics when the plugin holds the request headers (see OnResponseBody).
func (s *Stream) OnRequestBody(chunk []byte, end bool) (hostmodel.Action, []byte) {
	a, out, err := s.h.RequestBody(native{}, s.StreamState, chunk, end)
	if err != nil {
		panic(err)
	}
	return a, out
}

// OnResponseBody passes a chunk of the response body (Core.ResponseBody).
// It panics when the plugin holds the response headers: Envoy passes no
// body then, and a test that does would pass where Envoy hangs.
func (s *Stream) OnResponseBody(chunk []byte, end bool) (hostmodel.Action, []byte) {
	a, out, err := s.h.ResponseBody(native{}, s.StreamState, chunk, end)
	if err != nil {
		panic(err)
	}
	return a, out
}

// Done ends the stream; its callouts stay, as in Envoy.
func (s *Stream) Done() { _ = s.h.EndStream(native{}, s.StreamState) }

// Respond delivers a callout's answer (no headers: a reset).
func (h *Host) Respond(token uint32, resp hostmodel.CalloutResponse) error {
	return h.Deliver(native{}, token, resp)
}

// native is the binding called natively, as the Core's Guest; its
// callbacks cannot fail.
type native struct{}

func (native) OnRequestHeaders(id, n uint32, end bool) (uint32, error) {
	return proxywasm.Native.RequestHeaders(id, n, end), nil
}

func (native) OnResponseHeaders(id, n uint32, end bool) (uint32, error) {
	return proxywasm.Native.ResponseHeaders(id, n, end), nil
}

func (native) OnRequestBody(id, size uint32, end bool) (uint32, error) {
	return proxywasm.Native.RequestBody(id, size, end), nil
}

func (native) OnResponseBody(id, size uint32, end bool) (uint32, error) {
	return proxywasm.Native.ResponseBody(id, size, end), nil
}

func (native) OnHttpCallResponse(rootID, token, numHeaders, bodySize uint32) error {
	proxywasm.Native.HttpCallResponse(rootID, token, numHeaders, bodySize, 0)
	return nil
}

func (native) OnStreamEnd(id uint32) error {
	proxywasm.Native.Done(id)
	proxywasm.Native.Delete(id)
	return nil
}

// Counter returns a metric's value.
func (h *Host) Counter(name string) int64 { return h.metrics.Value(name) }
