package hostmodel

import (
	"cmp"
	"slices"
	"time"

	"github.com/tollgate-rl/tollgate/filter/proxywasm/abi"
)

// Core is the host model of one VM, with Envoy's semantics: its streams, the
// effective context, the callouts in flight and the answer being delivered,
// and the plugin's shared data and metrics. Two fronts drive it: VM, which
// runs the compiled module under wazero and turns guest memory into these
// calls, and proxytest, which runs the plugin natively (its methods are the
// binding's NativeHost). Statuses are ABI statuses.
type Core struct {
	config   []byte
	clusters map[string]bool
	shared   *SharedData
	metrics  *Metrics
	logSink  func(abi.LogLevel, string)

	rootID    uint32
	nextID    uint32
	streams   map[uint32]*StreamState
	effective uint32
	callouts  map[uint32]*Callout
	nextToken uint32
	delivery  *CalloutResponse // the callout answer being delivered
	tick      time.Duration
	logs      []LogLine

	// OnCallout is called when the guest dispatches a callout (synchronously,
	// inside the guest's call; start the request elsewhere and deliver the
	// answer later).
	OnCallout func(*Callout)
}

// StreamState is what the host knows of one HTTP stream.
type StreamState struct {
	ID              uint32
	RequestHeaders  Headers
	ResponseHeaders Headers
	// Properties answer proxy_get_property; "source.address" is the peer.
	Properties map[string]string
	// Resumed is set when the guest continued a paused request.
	Resumed bool
	// Local is set when the guest answered the request itself.
	Local *LocalResponse
	// requestSent: the request headers went on (Continue, or resumed);
	// writing them fails from then on, as in Envoy.
	requestSent bool
	// RequestBody is the request body the host holds for the filter: the
	// chunk passing, with what the filter buffered before it
	// (StopIterationAndBuffer). requestHeld: the guest paused the request
	// headers and has not resumed them (no body callback then: see
	// responseHeld).
	RequestBody []byte
	requestHeld bool
	// ResponseBody is the response body the host holds for the filter: the
	// chunk passing, with what the filter buffered before it
	// (StopIterationAndBuffer). ResponseResumed is set when the guest
	// continued a paused response.
	ResponseBody    []byte
	ResponseResumed bool
	// responseHeld: the guest paused the response headers and has not
	// resumed them. Envoy then calls no body callback of the filter
	// (proxy-wasm-cpp-host turns the headers' StopIteration into
	// StopAllIterationAndWatermark unless the plugin's
	// allow_on_headers_stop_iteration is set): it buffers the body until
	// the filter resumes.
	responseHeld bool
}

// CoreOptions configure a Core.
type CoreOptions struct {
	PluginConfig []byte
	Clusters     []string
	// Shared and Metrics are the plugin's, shared by all its VMs (new ones
	// when nil).
	Shared  *SharedData
	Metrics *Metrics
	// Log receives proxy_log lines besides the core's own record.
	Log func(abi.LogLevel, string)
}

// NewCore returns the model of a fresh VM with root context 1.
func NewCore(o CoreOptions) *Core {
	c := &Core{config: o.PluginConfig, clusters: map[string]bool{}, shared: o.Shared, metrics: o.Metrics, logSink: o.Log,
		rootID: 1, nextID: 2, streams: map[uint32]*StreamState{}, callouts: map[uint32]*Callout{}}
	for _, name := range o.Clusters {
		c.clusters[name] = true
	}
	if c.shared == nil {
		c.shared = &SharedData{}
	}
	if c.metrics == nil {
		c.metrics = &Metrics{}
	}
	return c
}

// RootID is the root (plugin) context's id.
func (c *Core) RootID() uint32 { return c.rootID }

// OpenStream registers a new stream and makes it effective.
func (c *Core) OpenStream(req Headers, props map[string]string) *StreamState {
	s := &StreamState{ID: c.nextID, RequestHeaders: LowerKeys(req), Properties: props}
	if s.Properties == nil {
		s.Properties = map[string]string{}
	}
	c.nextID++
	c.streams[s.ID] = s
	c.effective = s.ID
	return s
}

// CloseStream forgets a stream. Its callouts stay: Envoy dispatches them
// from the root context and delivers their answers all the same.
func (c *Core) CloseStream(id uint32) { delete(c.streams, id) }

// Enter makes a context effective, as the host does before a callback.
func (c *Core) Enter(id uint32) { c.effective = id }

// PendingCallouts lists the callouts in flight.
func (c *Core) PendingCallouts() []*Callout {
	out := make([]*Callout, 0, len(c.callouts))
	for _, co := range c.callouts {
		out = append(out, co)
	}
	slices.SortFunc(out, func(a, b *Callout) int { return cmp.Compare(a.Token, b.Token) })
	return out
}

// Logs returns the proxy_log lines kept (the last ones).
func (c *Core) Logs() []LogLine { return append([]LogLine(nil), c.logs...) }

// TickPeriod is the period the plugin asked for.
func (c *Core) TickPeriod() time.Duration { return c.tick }

// --- the host calls (proxywasm's NativeHost)

func (c *Core) Log(level abi.LogLevel, msg string) {
	c.logs = append(c.logs, LogLine{Level: level, Msg: msg})
	if len(c.logs) > 1000 {
		c.logs = c.logs[len(c.logs)-500:]
	}
	if c.logSink != nil {
		c.logSink(level, msg)
	}
}

func (c *Core) GetBuffer(bufferType abi.BufferType, start, maxSize uint32) ([]byte, abi.Status) {
	var buf []byte
	switch bufferType {
	case abi.BufferPluginConfiguration:
		if len(c.config) == 0 {
			return nil, abi.StatusNotFound
		}
		buf = c.config
	case abi.BufferVMConfiguration:
	case abi.BufferHttpCallResponseBody:
		if c.delivery == nil {
			return nil, abi.StatusNotFound
		}
		buf = c.delivery.Body
	case abi.BufferHttpRequestBody:
		s := c.streams[c.effective]
		if s == nil {
			return nil, abi.StatusNotFound
		}
		buf = s.RequestBody
	case abi.BufferHttpResponseBody:
		s := c.streams[c.effective]
		if s == nil {
			return nil, abi.StatusNotFound
		}
		buf = s.ResponseBody
	default:
		return nil, abi.StatusNotFound
	}
	if uint64(start) > uint64(len(buf)) {
		return nil, abi.StatusBadArgument
	}
	end := min(uint64(start)+uint64(maxSize), uint64(len(buf)))
	return buf[start:end], abi.StatusOK
}

// headerMap returns a readable map of the effective context.
func (c *Core) headerMap(t abi.MapType) *Headers {
	if t == abi.MapHttpCallResponseHeaders {
		if c.delivery == nil {
			return nil
		}
		return &c.delivery.Headers
	}
	s := c.streams[c.effective]
	if s == nil {
		return nil
	}
	switch t {
	case abi.MapHttpRequestHeaders:
		return &s.RequestHeaders
	case abi.MapHttpResponseHeaders:
		return &s.ResponseHeaders
	}
	return nil
}

// writableMap returns a map of the effective context the guest may change.
func (c *Core) writableMap(t abi.MapType) *Headers {
	s := c.streams[c.effective]
	if s == nil {
		return nil
	}
	switch t {
	case abi.MapHttpRequestHeaders:
		if s.requestSent {
			return nil // gone upstream: Envoy answers BadArgument
		}
		return &s.RequestHeaders
	case abi.MapHttpResponseHeaders:
		return &s.ResponseHeaders
	}
	return nil
}

func (c *Core) GetHeaderMapPairs(mapType abi.MapType) ([][2]string, abi.Status) {
	hm := c.headerMap(mapType)
	if hm == nil {
		return nil, abi.StatusBadArgument
	}
	return *hm, abi.StatusOK
}

func (c *Core) GetHeaderMapValue(mapType abi.MapType, key string) (string, abi.Status) {
	hm := c.headerMap(mapType)
	if hm == nil {
		return "", abi.StatusBadArgument
	}
	v, ok := hm.Get(key)
	if !ok {
		return "", abi.StatusNotFound
	}
	return v, abi.StatusOK
}

func (c *Core) edit(mapType abi.MapType, f func(*Headers)) abi.Status {
	hm := c.writableMap(mapType)
	if hm == nil {
		return abi.StatusBadArgument
	}
	f(hm)
	return abi.StatusOK
}

func (c *Core) SetHeaderMapPairs(mapType abi.MapType, pairs [][2]string) abi.Status {
	return c.edit(mapType, func(hm *Headers) { *hm = LowerKeys(pairs) })
}

func (c *Core) AddHeaderMapValue(mapType abi.MapType, key, value string) abi.Status {
	return c.edit(mapType, func(hm *Headers) { hm.Add(key, value) })
}

func (c *Core) ReplaceHeaderMapValue(mapType abi.MapType, key, value string) abi.Status {
	return c.edit(mapType, func(hm *Headers) { hm.Replace(key, value) })
}

func (c *Core) RemoveHeaderMapValue(mapType abi.MapType, key string) abi.Status {
	return c.edit(mapType, func(hm *Headers) { hm.Remove(key) })
}

// GetProperty reads a property of the effective stream; path parts are
// NUL-separated, as the ABI sends them.
func (c *Core) GetProperty(path string) ([]byte, abi.Status) {
	v, st := Property(c, path)
	if st != abi.StatusOK {
		return nil, st
	}
	return []byte(v), abi.StatusOK
}

// Property looks a NUL-separated path up as its dotted name, spelled in a
// stack buffer (properties are read on every request).
func Property[T string | []byte](c *Core, path T) (string, abi.Status) {
	s := c.streams[c.effective]
	if s == nil {
		return "", abi.StatusNotFound
	}
	var buf [64]byte
	name := append(buf[:0], path...)
	for i, ch := range name {
		if ch == 0 {
			name[i] = '.'
		}
	}
	v, ok := s.Properties[string(name)]
	if !ok {
		return "", abi.StatusNotFound
	}
	return v, abi.StatusOK
}

func (c *Core) SendLocalResponse(status uint32, headers [][2]string, body []byte) abi.Status {
	s := c.streams[c.effective]
	if s == nil {
		return abi.StatusBadArgument
	}
	s.Local = &LocalResponse{Status: int(status), Headers: LowerKeys(headers), Body: append([]byte(nil), body...)}
	return abi.StatusOK
}

// HttpCall registers a callout of the effective context. Envoy refuses an
// unknown cluster and a request without :method, :path or :authority.
func (c *Core) HttpCall(cluster string, headers [][2]string, body []byte, timeoutMs uint32) (uint32, abi.Status) {
	hm := LowerKeys(headers)
	if !c.clusters[cluster] {
		return 0, abi.StatusBadArgument
	}
	for _, required := range []string{":method", ":path", ":authority"} {
		if hm.Value(required) == "" {
			return 0, abi.StatusBadArgument
		}
	}
	c.nextToken++
	co := &Callout{Token: c.nextToken, ContextID: c.effective, Cluster: cluster, Headers: hm,
		Body: append([]byte(nil), body...), TimeoutMs: timeoutMs}
	c.callouts[co.Token] = co
	if c.OnCallout != nil {
		c.OnCallout(co)
	}
	return co.Token, abi.StatusOK
}

func (c *Core) ContinueStream(streamType abi.StreamType) abi.Status {
	s := c.streams[c.effective]
	if s == nil {
		return abi.StatusBadArgument
	}
	switch streamType {
	case abi.StreamRequest:
		s.Resumed = true
		s.requestSent = true // Envoy releases the request headers here
		s.requestHeld = false
	case abi.StreamResponse:
		s.ResponseResumed = true
		s.responseHeld = false
	}
	return abi.StatusOK
}

func (c *Core) SetEffectiveContext(id uint32) abi.Status {
	if _, ok := c.streams[id]; !ok && id != c.rootID {
		return abi.StatusBadArgument
	}
	c.effective = id
	return abi.StatusOK
}

func (c *Core) GetSharedData(key string) ([]byte, uint32, abi.Status) {
	v, cas, ok := c.shared.Get(key)
	if !ok {
		return nil, 0, abi.StatusNotFound
	}
	return v, cas, abi.StatusOK
}

func (c *Core) SetSharedData(key string, value []byte, cas uint32) abi.Status {
	return c.shared.Set(key, value, cas)
}

func (c *Core) SetTickPeriod(periodMs uint32) abi.Status {
	c.tick = time.Duration(periodMs) * time.Millisecond
	return abi.StatusOK
}

func (c *Core) DefineMetric(kind abi.MetricType, name string) (uint32, abi.Status) {
	return c.metrics.Define(kind, name)
}

func (c *Core) IncrementMetric(id uint32, offset int64) abi.Status {
	return c.metrics.Increment(id, offset)
}

func (c *Core) RecordMetric(id uint32, value uint64) abi.Status { return c.metrics.Record(id, value) }

// LogLine is one proxy_log call.
type LogLine struct {
	Level abi.LogLevel
	Msg   string
}
