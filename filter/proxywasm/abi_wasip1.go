//go:build wasip1 && !tollgate_fakehost

package proxywasm

import (
	"github.com/tollgate-rl/tollgate/filter/proxywasm/abi"
)

// The host functions of proxy-wasm ABI v0.2.1 that the filter imports. Every
// parameter is an i32 or i64 at the boundary; out-parameters are pointers to
// package-level slots (see hostcall.go) so that they do not escape per call.

//go:wasmimport env proxy_log
func proxyLog(level abi.LogLevel, msg *byte, size uint32) abi.Status

//go:wasmimport env proxy_get_buffer_bytes
func proxyGetBufferBytes(bufferType abi.BufferType, start, maxSize uint32, retData *uint32, retSize *uint32) abi.Status

//go:wasmimport env proxy_get_header_map_value
func proxyGetHeaderMapValue(mapType abi.MapType, key *byte, keySize uint32, retData *uint32, retSize *uint32) abi.Status

//go:wasmimport env proxy_get_header_map_pairs
func proxyGetHeaderMapPairs(mapType abi.MapType, retData *uint32, retSize *uint32) abi.Status

//go:wasmimport env proxy_set_header_map_pairs
func proxySetHeaderMapPairs(mapType abi.MapType, pairs *byte, pairsSize uint32) abi.Status

//go:wasmimport env proxy_add_header_map_value
func proxyAddHeaderMapValue(mapType abi.MapType, key *byte, keySize uint32, value *byte, valueSize uint32) abi.Status

//go:wasmimport env proxy_replace_header_map_value
func proxyReplaceHeaderMapValue(mapType abi.MapType, key *byte, keySize uint32, value *byte, valueSize uint32) abi.Status

//go:wasmimport env proxy_remove_header_map_value
func proxyRemoveHeaderMapValue(mapType abi.MapType, key *byte, keySize uint32) abi.Status

//go:wasmimport env proxy_get_property
func proxyGetProperty(path *byte, pathSize uint32, retData *uint32, retSize *uint32) abi.Status

//go:wasmimport env proxy_send_local_response
func proxySendLocalResponse(status uint32, details *byte, detailsSize uint32, body *byte, bodySize uint32, headers *byte, headersSize uint32, grpcStatus int32) abi.Status

//go:wasmimport env proxy_http_call
func proxyHttpCall(upstream *byte, upstreamSize uint32, headers *byte, headersSize uint32, body *byte, bodySize uint32, trailers *byte, trailersSize uint32, timeoutMs uint32, retToken *uint32) abi.Status

//go:wasmimport env proxy_continue_stream
func proxyContinueStream(streamType abi.StreamType) abi.Status

//go:wasmimport env proxy_set_effective_context
func proxySetEffectiveContext(contextID uint32) abi.Status

//go:wasmimport env proxy_get_shared_data
func proxyGetSharedData(key *byte, keySize uint32, retData *uint32, retSize *uint32, retCas *uint32) abi.Status

//go:wasmimport env proxy_set_shared_data
func proxySetSharedData(key *byte, keySize uint32, value *byte, valueSize uint32, cas uint32) abi.Status

//go:wasmimport env proxy_set_tick_period_milliseconds
func proxySetTickPeriodMilliseconds(period uint32) abi.Status

//go:wasmimport env proxy_define_metric
func proxyDefineMetric(metricType abi.MetricType, name *byte, nameSize uint32, retID *uint32) abi.Status

//go:wasmimport env proxy_increment_metric
func proxyIncrementMetric(id uint32, offset int64) abi.Status

//go:wasmimport env proxy_record_metric
func proxyRecordMetric(id uint32, value uint64) abi.Status

// random_get is WASI's, not proxy-wasm's: Envoy answers it in every phase.
// The filter takes its random bytes here rather than from crypto/rand, whose
// first read arms a one-minute warning timer; a timer starts Go's poller, and
// Envoy 1.33-1.38 fail the poller's poll_oneoff, which Go treats as fatal.
//
//go:wasmimport wasi_snapshot_preview1 random_get
func randomGet(buf *byte, size uint32) uint32

// clockTimeGet is WASI's clock, called directly: Go's time.Now asks it
// twice (wall and monotonic clocks), the filter needs the wall clock only.
//
//go:wasmimport wasi_snapshot_preview1 clock_time_get
func clockTimeGet(clockID uint32, precision uint64, time *uint64) uint32

var wallNs uint64

// WallClock is the host's wall clock in one host call (time.Now makes two);
// 0 when the host has none.
func WallClock() Time {
	if clockTimeGet(0, 1, &wallNs) != 0 {
		return 0
	}
	return Time(wallNs)
}
