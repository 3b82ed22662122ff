package proxywasm

import (
	"errors"
	"strconv"
	"unsafe"

	"github.com/tollgate-rl/tollgate/filter/proxywasm/abi"
	"github.com/tollgate-rl/tollgate/filter/proxywasm/headermap"
	"github.com/tollgate-rl/tollgate/filter/proxywasm/types"
)

// Out-parameter slots. A pointer handed to a wasmimport escapes, so a local
// would be heap-allocated on every call; these are allocated once.
var (
	retData, retSize, retCas, retID uint32
)

// allocBuf is the last buffer handed to the host by proxy_on_memory_allocate.
// It stays referenced until the call that asked for it has read it, so the
// GC cannot reuse it in between.
var allocBuf []byte

// scratch is the buffer a *Scratch call's answer is written into, reused
// from one call to the next (an allocation under wazero costs about as
// much as the rest of a small host call); inScratch says the allocation
// the host asks for now is that answer's.
var (
	scratch   []byte
	inScratch bool
)

// maxScratch bounds what the scratch buffer grows to (and keeps): a larger
// answer gets an allocation of its own.
const maxScratch = 4096

func allocate(size uint32) *byte {
	if size == 0 {
		allocBuf = []byte{}
		return nil
	}
	if inScratch && size <= maxScratch {
		inScratch = false
		if uint32(cap(scratch)) < size {
			scratch = make([]byte, size)
		}
		allocBuf = scratch[:size]
		return &allocBuf[0]
	}
	allocBuf = make([]byte, size)
	return &allocBuf[0]
}

// hostData hands out what the host wrote into the last allocation.
func hostData() []byte {
	b := allocBuf
	allocBuf = nil
	if retSize == 0 || uint32(len(b)) < retSize {
		return nil
	}
	return b[:retSize]
}

// owned is a string of bytes the host just wrote into a fresh allocation:
// nothing else references that memory or ever writes it again, so it can be
// a string as it is, without a copy.
func owned(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(&b[0], len(b))
}

func statusErr(st abi.Status) error {
	switch st {
	case abi.StatusOK:
		return nil
	case abi.StatusNotFound:
		return types.ErrorStatusNotFound
	case abi.StatusBadArgument:
		return types.ErrorStatusBadArgument
	case abi.StatusEmpty:
		return types.ErrorStatusEmpty
	case abi.StatusCasMismatch:
		return types.ErrorStatusCasMismatch
	case abi.StatusInternalFailure:
		return types.ErrorInternalFailure
	}
	return types.ErrorUnimplemented
}

func strPtr(s string) *byte {
	if s == "" {
		return nil
	}
	return unsafe.StringData(s)
}

func bytesPtr(b []byte) *byte {
	if len(b) == 0 {
		return nil
	}
	return &b[0]
}

// --- logging

func log(level abi.LogLevel, msg string) { proxyLog(level, strPtr(msg), uint32(len(msg))) }

func LogDebug(msg string)    { log(abi.LogDebug, msg) }
func LogInfo(msg string)     { log(abi.LogInfo, msg) }
func LogWarn(msg string)     { log(abi.LogWarn, msg) }
func LogError(msg string)    { log(abi.LogError, msg) }
func LogCritical(msg string) { log(abi.LogCritical, msg) }

// --- configuration and properties

// GetPluginConfiguration returns the plugin configuration.
func GetPluginConfiguration() ([]byte, error) {
	return getBuffer(abi.BufferPluginConfiguration, 0, 1<<30)
}

func getBuffer(bufferType abi.BufferType, start, maxSize uint32) ([]byte, error) {
	retSize = 0
	if err := statusErr(proxyGetBufferBytes(bufferType, start, maxSize, &retData, &retSize)); err != nil {
		allocBuf = nil
		return nil, err
	}
	return hostData(), nil
}

// GetProperty reads a host property ("source", "address").
func GetProperty(path []string) ([]byte, error) {
	n := 0
	for _, p := range path {
		n += len(p) + 1
	}
	if n == 0 {
		return nil, types.ErrorStatusBadArgument
	}
	buf := make([]byte, 0, n)
	for i, p := range path {
		if i > 0 {
			buf = append(buf, 0)
		}
		buf = append(buf, p...)
	}
	retSize = 0
	if err := statusErr(proxyGetProperty(&buf[0], uint32(len(buf)), &retData, &retSize)); err != nil {
		allocBuf = nil
		return nil, err
	}
	return hostData(), nil
}

// GetPropertyString reads a host property by its path already in the ABI's
// form, the parts NUL-separated ("source\x00address"): no path to encode per
// call, and the value as a string without a copy.
func GetPropertyString(path string) (string, error) {
	if path == "" {
		return "", types.ErrorStatusBadArgument
	}
	retSize = 0
	if err := statusErr(proxyGetProperty(strPtr(path), uint32(len(path)), &retData, &retSize)); err != nil {
		allocBuf = nil
		return "", err
	}
	return owned(hostData()), nil
}

// GetPropertyScratch is GetPropertyString for a value read and dropped at
// once: it is written into a buffer the next *Scratch call reuses, so the
// string is valid only until then, and nothing may keep it (or a part of
// it).
func GetPropertyScratch(path string) (string, error) {
	inScratch = true
	v, err := GetPropertyString(path)
	inScratch = false
	return v, err
}

// --- headers

func getMapValue(mapType abi.MapType, key string) (string, error) {
	retSize = 0
	if err := statusErr(proxyGetHeaderMapValue(mapType, strPtr(key), uint32(len(key)), &retData, &retSize)); err != nil {
		allocBuf = nil
		return "", err
	}
	return string(hostData()), nil
}

func getMap(mapType abi.MapType) ([][2]string, error) {
	retSize = 0
	if err := statusErr(proxyGetHeaderMapPairs(mapType, &retData, &retSize)); err != nil {
		allocBuf = nil
		return nil, err
	}
	return headermap.Decode(hostData())
}

// GetHttpRequestHeader returns the first value of a request header.
func GetHttpRequestHeader(key string) (string, error) {
	return getMapValue(abi.MapHttpRequestHeaders, key)
}

// GetHttpRequestHeaders returns every request header.
func GetHttpRequestHeaders() ([][2]string, error) { return getMap(abi.MapHttpRequestHeaders) }

// GetHttpRequestHeaderMap returns the request headers as the host
// serialised them, for headermap.Walk: one allocation however many headers
// there are, and the keys and values Walk yields are substrings that stay
// valid. (Not in the SDK: the hot path reads every header, and decoding them
// all into strings was a quarter of its allocations.)
func GetHttpRequestHeaderMap() (string, error) {
	retSize = 0
	if err := statusErr(proxyGetHeaderMapPairs(abi.MapHttpRequestHeaders, &retData, &retSize)); err != nil {
		allocBuf = nil
		return "", err
	}
	return owned(hostData()), nil
}

// RemoveHttpRequestHeader removes every value of a request header.
func RemoveHttpRequestHeader(key string) error {
	return statusErr(proxyRemoveHeaderMapValue(abi.MapHttpRequestHeaders, strPtr(key), uint32(len(key))))
}

// ReplaceHttpRequestHeaders replaces every request header with headers, in
// one host call.
func ReplaceHttpRequestHeaders(headers [][2]string) error {
	h := headermap.Encode(headers)
	return statusErr(proxySetHeaderMapPairs(abi.MapHttpRequestHeaders, bytesPtr(h), uint32(len(h))))
}

// ReplaceHttpRequestHeader sets a request header to one value.
func ReplaceHttpRequestHeader(key, value string) error {
	return statusErr(proxyReplaceHeaderMapValue(abi.MapHttpRequestHeaders, strPtr(key), uint32(len(key)), strPtr(value), uint32(len(value))))
}

// AddHttpResponseHeader adds a response header value.
func AddHttpResponseHeader(key, value string) error {
	return statusErr(proxyAddHeaderMapValue(abi.MapHttpResponseHeaders, strPtr(key), uint32(len(key)), strPtr(value), uint32(len(value))))
}

// ReplaceHttpResponseHeader sets a response header to one value.
func ReplaceHttpResponseHeader(key, value string) error {
	return statusErr(proxyReplaceHeaderMapValue(abi.MapHttpResponseHeaders, strPtr(key), uint32(len(key)), strPtr(value), uint32(len(value))))
}

// ReplaceHttpResponseHeaderBytes is ReplaceHttpResponseHeader with the value
// in a buffer the caller reuses (the host copies it during the call).
func ReplaceHttpResponseHeaderBytes(key string, value []byte) error {
	return statusErr(proxyReplaceHeaderMapValue(abi.MapHttpResponseHeaders, strPtr(key), uint32(len(key)), bytesPtr(value), uint32(len(value))))
}

// --- stream control

// SetEffectiveContext makes another stream's context the one later host
// calls act on (inside a callback of this VM): a callout's answer that
// also decides other waiting requests resumes each in its own context.
func SetEffectiveContext(contextID uint32) error {
	if err := statusErr(proxySetEffectiveContext(contextID)); err != nil {
		return err
	}
	activeID = contextID
	return nil
}

// ResumeHttpRequest resumes a paused request.
func ResumeHttpRequest() error { return statusErr(proxyContinueStream(abi.StreamRequest)) }

// ResumeHttpResponse resumes a paused response (its held headers, its
// buffered body).
func ResumeHttpResponse() error { return statusErr(proxyContinueStream(abi.StreamResponse)) }

// GetHttpRequestBodyScratch returns part of the request body the host
// holds in the body callback (the chunk passing, or everything buffered so
// far), into the buffer the next *Scratch call reuses: nothing may keep it.
func GetHttpRequestBodyScratch(start, maxSize int) ([]byte, error) {
	inScratch = true
	b, err := getBuffer(abi.BufferHttpRequestBody, uint32(start), uint32(maxSize))
	inScratch = false
	return b, err
}

// GetHttpResponseBody returns part of the response body the host holds in
// the body callback: the chunk passing, or everything buffered so far.
func GetHttpResponseBody(start, maxSize int) ([]byte, error) {
	return getBuffer(abi.BufferHttpResponseBody, uint32(start), uint32(maxSize))
}

// GetHttpResponseHeaderMap returns the response headers as the host
// serialised them, for headermap.Walk (see GetHttpRequestHeaderMap).
func GetHttpResponseHeaderMap() (string, error) {
	retSize = 0
	if err := statusErr(proxyGetHeaderMapPairs(abi.MapHttpResponseHeaders, &retData, &retSize)); err != nil {
		allocBuf = nil
		return "", err
	}
	return owned(hostData()), nil
}

// SendHttpResponse answers the request locally; it does not reach upstream.
func SendHttpResponse(statusCode uint32, headers [][2]string, body []byte, gRPCStatus int32) error {
	return SendHttpResponseEncoded(statusCode, headermap.Encode(headers), body, gRPCStatus)
}

// SendHttpResponseEncoded is SendHttpResponse with the headers already
// serialised (headermap): the host copies them and the body, so a caller
// may render both into buffers it reuses.
func SendHttpResponseEncoded(statusCode uint32, headers, body []byte, gRPCStatus int32) error {
	return statusErr(proxySendLocalResponse(statusCode, nil, 0, bytesPtr(body), uint32(len(body)), bytesPtr(headers), uint32(len(headers)), gRPCStatus))
}

// --- callouts

// DispatchHttpCall sends an HTTP request to a cluster; callBack runs when the
// answer (or a failure) arrives.
func DispatchHttpCall(cluster string, headers [][2]string, body []byte, trailers [][2]string,
	timeoutMs uint32, callBack func(numHeaders, bodySize, numTrailers int)) (uint32, error) {
	return dispatch(cluster, headermap.Encode(headers), body, headermap.Encode(trailers), timeoutMs, callout{cb: callBack})
}

// DispatchHttpCallTo is DispatchHttpCall with the headers already
// serialised (headermap.Encode: a caller whose callout headers never change
// encodes them once), no trailers, and the answer delivered to recv (with
// kind) instead of a callback: no closure to allocate per callout.
func DispatchHttpCallTo(cluster string, headers, body []byte, timeoutMs uint32, recv CalloutReceiver, kind uint8) (uint32, error) {
	return dispatch(cluster, headers, body, nil, timeoutMs, callout{recv: recv, kind: kind})
}

// dispatch sends a callout and keeps c (its context filled in here) for
// the answer.
func dispatch(cluster string, h, body, t []byte, timeoutMs uint32, c callout) (uint32, error) {
	var token uint32
	st := proxyHttpCall(strPtr(cluster), uint32(len(cluster)), bytesPtr(h), uint32(len(h)), bytesPtr(body), uint32(len(body)),
		bytesPtr(t), uint32(len(t)), timeoutMs, &retID)
	if err := statusErr(st); err != nil {
		return 0, err
	}
	token = retID
	root := activeID
	if s, ok := streams.get(activeID); ok {
		root = s.rootID
	}
	if p, ok := plugins[root]; ok {
		c.contextID = activeID
		p.callouts.put(token, c)
	}
	return token, nil
}

// GetHttpCallResponseHeaders returns the callout answer's headers (inside the
// callback only).
func GetHttpCallResponseHeaders() ([][2]string, error) { return getMap(abi.MapHttpCallResponseHeaders) }

// GetHttpCallResponseHeaderMap returns the callout answer's headers as the
// host serialised them, for headermap.Walk (inside the callback only): one
// allocation, and the keys and values are substrings that stay valid.
func GetHttpCallResponseHeaderMap() (string, error) {
	retSize = 0
	if err := statusErr(proxyGetHeaderMapPairs(abi.MapHttpCallResponseHeaders, &retData, &retSize)); err != nil {
		allocBuf = nil
		return "", err
	}
	return owned(hostData()), nil
}

// GetHttpCallResponseBody returns part of the callout answer's body.
func GetHttpCallResponseBody(start, maxSize int) ([]byte, error) {
	return getBuffer(abi.BufferHttpCallResponseBody, uint32(start), uint32(maxSize))
}

// --- shared data

// GetSharedData reads a shared-data entry and its CAS value.
func GetSharedData(key string) ([]byte, uint32, error) {
	retSize, retCas = 0, 0
	if err := statusErr(proxyGetSharedData(strPtr(key), uint32(len(key)), &retData, &retSize, &retCas)); err != nil {
		allocBuf = nil
		return nil, 0, err
	}
	return hostData(), retCas, nil
}

// GetSharedDataScratch is GetSharedData for a value read and dropped at
// once, into the buffer the next *Scratch call reuses (GetPropertyScratch):
// nothing may keep it, or a part of it.
func GetSharedDataScratch(key string) ([]byte, uint32, error) {
	inScratch = true
	v, cas, err := GetSharedData(key)
	inScratch = false
	return v, cas, err
}

// SetSharedData writes a shared-data entry if its CAS still is cas (0: always).
func SetSharedData(key string, data []byte, cas uint32) error {
	return statusErr(proxySetSharedData(strPtr(key), uint32(len(key)), bytesPtr(data), uint32(len(data)), cas))
}

// --- randomness

// RandomBytes fills b with random bytes from the host (WASI random_get).
// Use it instead of crypto/rand inside the module: see randomGet.
func RandomBytes(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	if errno := randomGet(&b[0], uint32(len(b))); errno != 0 {
		return errors.New("random_get failed: errno " + strconv.Itoa(int(errno)))
	}
	return nil
}

// --- timers and metrics

// SetTickPeriodMilliSeconds starts (or, with 0, stops) the plugin's tick.
func SetTickPeriodMilliSeconds(period uint32) error {
	return statusErr(proxySetTickPeriodMilliseconds(period))
}

// MetricCounter is a host counter.
type MetricCounter uint32

// MetricGauge is a host gauge.
type MetricGauge uint32

// MetricHistogram is a host histogram.
type MetricHistogram uint32

func defineMetric(kind abi.MetricType, name string) uint32 {
	retID = 0
	proxyDefineMetric(kind, strPtr(name), uint32(len(name)), &retID)
	return retID
}

// DefineCounterMetric defines (or finds) a counter.
func DefineCounterMetric(name string) MetricCounter {
	return MetricCounter(defineMetric(abi.MetricCounter, name))
}

// DefineGaugeMetric defines (or finds) a gauge.
func DefineGaugeMetric(name string) MetricGauge {
	return MetricGauge(defineMetric(abi.MetricGauge, name))
}

// DefineHistogramMetric defines (or finds) a histogram.
func DefineHistogramMetric(name string) MetricHistogram {
	return MetricHistogram(defineMetric(abi.MetricHistogram, name))
}

// Increment adds offset to the counter.
func (m MetricCounter) Increment(offset uint64) { proxyIncrementMetric(uint32(m), int64(offset)) }

// Add adds offset (which may be negative) to the gauge.
func (m MetricGauge) Add(offset int64) { proxyIncrementMetric(uint32(m), offset) }

// Record records one value.
func (m MetricHistogram) Record(value uint64) { proxyRecordMetric(uint32(m), value) }
