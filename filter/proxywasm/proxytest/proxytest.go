//go:build !wasip1

package proxytest

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/tollgate-rl/tollgate/filter/proxywasm"
	"github.com/tollgate-rl/tollgate/filter/proxywasm/types"
	"github.com/tollgate-rl/tollgate/filter/wasmhost"
)

const (
	stOK, stNotFound, stBadArgument, stCasMismatch = 0, 1, 2, 8
	rootID                                         = 1
)

// Host is a native stand-in for Envoy.
type Host struct {
	config    []byte
	clusters  map[string]bool
	streams   map[uint32]*Stream
	effective uint32
	nextID    uint32
	callouts  map[uint32]*wasmhost.Callout
	nextToken uint32
	delivery  *wasmhost.CalloutResponse
	shared    wasmhost.SharedData // the same model as the wazero host's
	metrics   wasmhost.Metrics
	Logs      []string
}

// New starts vm with the plugin configuration; clusters are the names
// callouts may use.
func New(vm types.VMContext, pluginConfig []byte, clusters ...string) (*Host, error) {
	h := &Host{config: pluginConfig, clusters: map[string]bool{}, streams: map[uint32]*Stream{}, nextID: 2,
		callouts: map[uint32]*wasmhost.Callout{}}
	for _, c := range clusters {
		h.clusters[c] = true
	}
	proxywasm.SetVMContext(vm)
	proxywasm.SetNativeHost(h)
	proxywasm.Native.ContextCreate(rootID, 0)
	if !proxywasm.Native.VMStart(rootID, 0) || !proxywasm.Native.Configure(rootID, uint32(len(pluginConfig))) {
		return nil, fmt.Errorf("plugin start failed: %s", strings.Join(h.Logs, "; "))
	}
	return h, nil
}

// Stream is one HTTP request.
type Stream struct {
	h               *Host
	ID              uint32
	RequestHeaders  wasmhost.Headers
	ResponseHeaders wasmhost.Headers
	Properties      map[string]string
	Resumed         bool
	Local           *wasmhost.LocalResponse
}

// NewStream creates an HTTP context.
func (h *Host) NewStream(req wasmhost.Headers, props map[string]string) *Stream {
	s := &Stream{h: h, ID: h.nextID, RequestHeaders: wasmhost.LowerKeys(req), Properties: props}
	h.nextID++
	h.streams[s.ID] = s
	h.effective = s.ID
	proxywasm.Native.ContextCreate(s.ID, rootID)
	return s
}

// OnRequestHeaders runs the request-headers callback; a local reply then
// passes the response path, as in Envoy.
func (s *Stream) OnRequestHeaders(end bool) wasmhost.Action {
	s.h.effective = s.ID
	a := wasmhost.Action(proxywasm.Native.RequestHeaders(s.ID, uint32(len(s.RequestHeaders)), end))
	s.finishLocal()
	return a
}

// OnResponseHeaders runs the response-headers callback.
func (s *Stream) OnResponseHeaders(headers wasmhost.Headers, end bool) wasmhost.Action {
	s.ResponseHeaders = wasmhost.LowerKeys(headers)
	s.h.effective = s.ID
	return wasmhost.Action(proxywasm.Native.ResponseHeaders(s.ID, uint32(len(s.ResponseHeaders)), end))
}

func (s *Stream) finishLocal() {
	if s.Local == nil || s.ResponseHeaders != nil {
		return
	}
	s.ResponseHeaders = append(wasmhost.Headers{{":status", fmt.Sprint(s.Local.Status)}}, s.Local.Headers...)
	s.h.effective = s.ID
	proxywasm.Native.ResponseHeaders(s.ID, uint32(len(s.ResponseHeaders)), false)
	s.Local.Headers = s.ResponseHeaders[1:]
}

// Done ends the stream.
func (s *Stream) Done() {
	s.h.effective = s.ID
	proxywasm.Native.Done(s.ID)
	proxywasm.Native.Delete(s.ID)
	delete(s.h.streams, s.ID)
	for t, c := range s.h.callouts {
		if c.ContextID == s.ID {
			delete(s.h.callouts, t)
		}
	}
}

// PendingCallouts lists unanswered callouts by token.
func (h *Host) PendingCallouts() []*wasmhost.Callout {
	out := make([]*wasmhost.Callout, 0, len(h.callouts))
	for _, c := range h.callouts {
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Token < out[j].Token })
	return out
}

// Respond delivers a callout's answer (no headers: a reset).
func (h *Host) Respond(token uint32, resp wasmhost.CalloutResponse) error {
	c, ok := h.callouts[token]
	if !ok {
		return errors.New("no such callout")
	}
	delete(h.callouts, token)
	h.delivery = &resp
	defer func() { h.delivery = nil }()
	h.effective = rootID
	proxywasm.Native.HttpCallResponse(rootID, token, uint32(len(resp.Headers)), uint32(len(resp.Body)), 0)
	if s, ok := h.streams[c.ContextID]; ok {
		s.finishLocal()
	}
	return nil
}

// Counter returns a metric's value.
func (h *Host) Counter(name string) int64 { return h.metrics.Value(name) }

// --- proxywasm.NativeHost

func (h *Host) Log(level uint32, msg string) { h.Logs = append(h.Logs, msg) }

func (h *Host) GetBuffer(bt, start, maxSize uint32) ([]byte, uint32) {
	var b []byte
	switch bt {
	case 7:
		if len(h.config) == 0 {
			return nil, stNotFound
		}
		b = h.config
	case 4:
		if h.delivery == nil {
			return nil, stNotFound
		}
		b = h.delivery.Body
	default:
		return nil, stNotFound
	}
	if int(start) > len(b) {
		return nil, stBadArgument
	}
	end := min(uint64(start)+uint64(maxSize), uint64(len(b)))
	return b[start:end], stOK
}

func (h *Host) headerMap(mt uint32) *wasmhost.Headers {
	if mt == 6 {
		if h.delivery == nil {
			return nil
		}
		return &h.delivery.Headers
	}
	s := h.streams[h.effective]
	if s == nil {
		return nil
	}
	switch mt {
	case 0:
		return &s.RequestHeaders
	case 2:
		return &s.ResponseHeaders
	}
	return nil
}

func (h *Host) GetHeaderMapPairs(mt uint32) ([][2]string, uint32) {
	m := h.headerMap(mt)
	if m == nil {
		return nil, stBadArgument
	}
	return *m, stOK
}

func (h *Host) GetHeaderMapValue(mt uint32, key string) (string, uint32) {
	m := h.headerMap(mt)
	if m == nil {
		return "", stBadArgument
	}
	v, ok := m.Get(key)
	if !ok {
		return "", stNotFound
	}
	return v, stOK
}

func (h *Host) edit(mt uint32, f func(*wasmhost.Headers)) uint32 {
	m := h.headerMap(mt)
	if m == nil || mt == 6 {
		return stBadArgument
	}
	f(m)
	return stOK
}

func (h *Host) SetHeaderMapPairs(mt uint32, pairs [][2]string) uint32 {
	return h.edit(mt, func(m *wasmhost.Headers) { *m = wasmhost.LowerKeys(pairs) })
}
func (h *Host) AddHeaderMapValue(mt uint32, k, v string) uint32 {
	return h.edit(mt, func(m *wasmhost.Headers) { m.Add(k, v) })
}
func (h *Host) ReplaceHeaderMapValue(mt uint32, k, v string) uint32 {
	return h.edit(mt, func(m *wasmhost.Headers) { m.Replace(k, v) })
}
func (h *Host) RemoveHeaderMapValue(mt uint32, k string) uint32 {
	return h.edit(mt, func(m *wasmhost.Headers) { m.Remove(k) })
}

func (h *Host) GetProperty(path string) ([]byte, uint32) {
	s := h.streams[h.effective]
	if s == nil {
		return nil, stNotFound
	}
	v, ok := s.Properties[strings.ReplaceAll(path, "\x00", ".")]
	if !ok {
		return nil, stNotFound
	}
	return []byte(v), stOK
}

func (h *Host) SendLocalResponse(status uint32, headers [][2]string, body []byte) uint32 {
	s := h.streams[h.effective]
	if s == nil {
		return stBadArgument
	}
	s.Local = &wasmhost.LocalResponse{Status: int(status), Headers: wasmhost.LowerKeys(headers), Body: body}
	return stOK
}

func (h *Host) HttpCall(cluster string, headers [][2]string, body []byte, timeout uint32) (uint32, uint32) {
	hm := wasmhost.LowerKeys(headers)
	if !h.clusters[cluster] || hm.Value(":method") == "" || hm.Value(":path") == "" || hm.Value(":authority") == "" {
		return 0, stBadArgument
	}
	h.nextToken++
	h.callouts[h.nextToken] = &wasmhost.Callout{Token: h.nextToken, ContextID: h.effective, Cluster: cluster, Headers: hm, Body: body, Timeout: timeout}
	return h.nextToken, stOK
}

func (h *Host) ContinueStream(st uint32) uint32 {
	s := h.streams[h.effective]
	if s == nil {
		return stBadArgument
	}
	if st == 0 {
		s.Resumed = true
	}
	return stOK
}

func (h *Host) SetEffectiveContext(id uint32) uint32 {
	if _, ok := h.streams[id]; !ok && id != rootID {
		return stBadArgument
	}
	h.effective = id
	return stOK
}

func (h *Host) GetSharedData(key string) ([]byte, uint32, uint32) {
	v, cas, ok := h.shared.Get(key)
	if !ok {
		return nil, 0, stNotFound
	}
	return v, cas, stOK
}

func (h *Host) SetSharedData(key string, value []byte, cas uint32) uint32 {
	return h.shared.Set(key, value, cas)
}

func (h *Host) SetTickPeriod(uint32) uint32 { return stOK }

func (h *Host) DefineMetric(kind uint32, name string) (uint32, uint32) {
	return h.metrics.Define(kind, name)
}

func (h *Host) IncrementMetric(id uint32, offset int64) uint32 {
	return h.metrics.Increment(id, offset)
}

func (h *Host) RecordMetric(id uint32, value uint64) uint32 {
	return h.metrics.Record(id, value)
}

var _ proxywasm.NativeHost = (*Host)(nil)
