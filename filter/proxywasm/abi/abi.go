// Package abi holds the numbers of proxy-wasm ABI v0.2.1, typed, in one
// place: the binding (filter/proxywasm) declares its host imports with these
// types, and the host model (proxywasm/hostmodel, behind both of its
// fronts) answers with them, so a map type can never be passed where a
// buffer type belongs.
package abi

// Status is a host call's result.
type Status uint32

const (
	StatusOK                   Status = 0
	StatusNotFound             Status = 1
	StatusBadArgument          Status = 2
	StatusSerializationFailure Status = 3
	StatusParseFailure         Status = 4
	StatusBadExpression        Status = 5
	StatusInvalidMemoryAccess  Status = 6
	StatusEmpty                Status = 7
	StatusCasMismatch          Status = 8
	StatusResultMismatch       Status = 9
	StatusInternalFailure      Status = 10
	StatusBrokenConnection     Status = 11
	StatusUnimplemented        Status = 12
)

// MapType selects a header map.
type MapType uint32

const (
	MapHttpRequestHeaders       MapType = 0
	MapHttpRequestTrailers      MapType = 1
	MapHttpResponseHeaders      MapType = 2
	MapHttpResponseTrailers     MapType = 3
	MapHttpCallResponseHeaders  MapType = 6
	MapHttpCallResponseTrailers MapType = 7
)

// BufferType selects a buffer.
type BufferType uint32

const (
	BufferHttpRequestBody      BufferType = 0
	BufferHttpResponseBody     BufferType = 1
	BufferHttpCallResponseBody BufferType = 4
	BufferVMConfiguration      BufferType = 6
	BufferPluginConfiguration  BufferType = 7
)

// StreamType selects the direction proxy_continue_stream resumes.
type StreamType uint32

const (
	StreamRequest  StreamType = 0
	StreamResponse StreamType = 1
)

// MetricType is a metric's kind.
type MetricType uint32

const (
	MetricCounter   MetricType = 0
	MetricGauge     MetricType = 1
	MetricHistogram MetricType = 2
)

// LogLevel is proxy_log's level.
type LogLevel uint32

const (
	LogTrace LogLevel = iota
	LogDebug
	LogInfo
	LogWarn
	LogError
	LogCritical
)
