//go:build !wasip1 || tollgate_fakehost

// The native binding: the ABI's host functions answered by a host model in
// the same process (proxytest), for tests and benchmarks. Under the
// tollgate_fakehost tag it is also built for wasip1, so that the plugin's
// native benchmarks run as Wasm with no call crossing to a host at all:
// scripts/codegen-floor measures Go's code generation for Wasm that way.

package proxywasm

import (
	"crypto/rand"
	"time"
	"unsafe"

	"github.com/tollgate-rl/tollgate/filter/proxywasm/abi"
	"github.com/tollgate-rl/tollgate/filter/proxywasm/headermap"
)

// NativeHost is the host outside Wasm: the same calls as the ABI, with Go
// values instead of guest memory. proxytest provides one, so that the plugin
// runs natively in unit tests and benchmarks. Statuses are ABI statuses.
type NativeHost interface {
	Log(level abi.LogLevel, msg string)
	GetBuffer(bufferType abi.BufferType, start, maxSize uint32) ([]byte, abi.Status)
	GetHeaderMapPairs(mapType abi.MapType) ([][2]string, abi.Status)
	GetHeaderMapValue(mapType abi.MapType, key string) (string, abi.Status)
	SetHeaderMapPairs(mapType abi.MapType, pairs [][2]string) abi.Status
	AddHeaderMapValue(mapType abi.MapType, key, value string) abi.Status
	ReplaceHeaderMapValue(mapType abi.MapType, key, value string) abi.Status
	RemoveHeaderMapValue(mapType abi.MapType, key string) abi.Status
	GetProperty(path string) ([]byte, abi.Status)
	SendLocalResponse(status uint32, headers [][2]string, body []byte) abi.Status
	HttpCall(cluster string, headers [][2]string, body []byte, timeoutMs uint32) (uint32, abi.Status)
	ContinueStream(streamType abi.StreamType) abi.Status
	SetEffectiveContext(contextID uint32) abi.Status
	GetSharedData(key string) ([]byte, uint32, abi.Status)
	SetSharedData(key string, value []byte, cas uint32) abi.Status
	SetTickPeriod(periodMs uint32) abi.Status
	DefineMetric(kind abi.MetricType, name string) (uint32, abi.Status)
	IncrementMetric(id uint32, offset int64) abi.Status
	RecordMetric(id uint32, value uint64) abi.Status
}

var native NativeHost

// SetNativeHost installs the host outside Wasm and forgets every context, as
// a fresh VM would.
func SetNativeHost(h NativeHost) {
	native = h
	plugins, streams, activeID = map[uint32]*pluginState{}, newIDTable[httpState](), 0
}

func str(p *byte, n uint32) string {
	if p == nil || n == 0 {
		return ""
	}
	return unsafe.String(p, n)
}

func raw(p *byte, n uint32) []byte {
	if p == nil || n == 0 {
		return nil
	}
	return unsafe.Slice(p, n)
}

// give hands data to the binding the way a host does: through
// proxy_on_memory_allocate and the size out-parameter.
func give(data []byte, st abi.Status, size *uint32) abi.Status {
	if st != abi.StatusOK {
		return st
	}
	allocate(uint32(len(data)))
	copy(allocBuf, data)
	*size = uint32(len(data))
	return abi.StatusOK
}

func decodeMap(p *byte, n uint32) [][2]string {
	m, _ := headermap.Decode(raw(p, n))
	return m
}

func proxyLog(level abi.LogLevel, msg *byte, size uint32) abi.Status {
	if native == nil {
		return abi.StatusUnimplemented
	}
	native.Log(level, str(msg, size))
	return abi.StatusOK
}

func proxyGetBufferBytes(bt abi.BufferType, start, maxSize uint32, _ *uint32, retSize *uint32) abi.Status {
	if native == nil {
		return abi.StatusUnimplemented
	}
	b, st := native.GetBuffer(bt, start, maxSize)
	return give(b, st, retSize)
}

func proxyGetHeaderMapValue(mt abi.MapType, key *byte, keySize uint32, _ *uint32, retSize *uint32) abi.Status {
	if native == nil {
		return abi.StatusUnimplemented
	}
	v, st := native.GetHeaderMapValue(mt, str(key, keySize))
	return give([]byte(v), st, retSize)
}

func proxyGetHeaderMapPairs(mt abi.MapType, _ *uint32, retSize *uint32) abi.Status {
	if native == nil {
		return abi.StatusUnimplemented
	}
	m, st := native.GetHeaderMapPairs(mt)
	nativeEnc = headermap.AppendEncode(nativeEnc[:0], m) // give copies it to the guest
	return give(nativeEnc, st, retSize)
}

// nativeEnc is reused to serialise header maps, as a host's own buffer.
var nativeEnc []byte

func proxySetHeaderMapPairs(mt abi.MapType, pairs *byte, ps uint32) abi.Status {
	if native == nil {
		return abi.StatusUnimplemented
	}
	m, err := headermap.Decode([]byte(str(pairs, ps)))
	if err != nil {
		return abi.StatusBadArgument
	}
	return native.SetHeaderMapPairs(mt, m)
}

func proxyAddHeaderMapValue(mt abi.MapType, key *byte, ks uint32, value *byte, vs uint32) abi.Status {
	if native == nil {
		return abi.StatusUnimplemented
	}
	return native.AddHeaderMapValue(mt, str(key, ks), str(value, vs))
}

func proxyReplaceHeaderMapValue(mt abi.MapType, key *byte, ks uint32, value *byte, vs uint32) abi.Status {
	if native == nil {
		return abi.StatusUnimplemented
	}
	return native.ReplaceHeaderMapValue(mt, str(key, ks), str(value, vs))
}

func proxyRemoveHeaderMapValue(mt abi.MapType, key *byte, ks uint32) abi.Status {
	if native == nil {
		return abi.StatusUnimplemented
	}
	return native.RemoveHeaderMapValue(mt, str(key, ks))
}

func proxyGetProperty(path *byte, ps uint32, _ *uint32, retSize *uint32) abi.Status {
	if native == nil {
		return abi.StatusUnimplemented
	}
	v, st := native.GetProperty(str(path, ps))
	return give(v, st, retSize)
}

func proxySendLocalResponse(status uint32, _ *byte, _ uint32, body *byte, bs uint32, headers *byte, hs uint32, _ int32) abi.Status {
	if native == nil {
		return abi.StatusUnimplemented
	}
	return native.SendLocalResponse(status, decodeMap(headers, hs), append([]byte(nil), raw(body, bs)...))
}

func proxyHttpCall(up *byte, us uint32, h *byte, hs uint32, b *byte, bs uint32, _ *byte, _ uint32, timeout uint32, token *uint32) abi.Status {
	if native == nil {
		return abi.StatusUnimplemented
	}
	t, st := native.HttpCall(str(up, us), decodeMap(h, hs), append([]byte(nil), raw(b, bs)...), timeout)
	*token = t
	return st
}

func proxyContinueStream(st abi.StreamType) abi.Status {
	if native == nil {
		return abi.StatusUnimplemented
	}
	return native.ContinueStream(st)
}

func proxySetEffectiveContext(id uint32) abi.Status {
	if native == nil {
		return abi.StatusUnimplemented
	}
	return native.SetEffectiveContext(id)
}

func proxyGetSharedData(key *byte, ks uint32, _ *uint32, retSize *uint32, cas *uint32) abi.Status {
	if native == nil {
		return abi.StatusUnimplemented
	}
	v, c, st := native.GetSharedData(str(key, ks))
	*cas = c
	return give(v, st, retSize)
}

func proxySetSharedData(key *byte, ks uint32, value *byte, vs uint32, cas uint32) abi.Status {
	if native == nil {
		return abi.StatusUnimplemented
	}
	return native.SetSharedData(str(key, ks), raw(value, vs), cas) // the host keeps a copy
}

func proxySetTickPeriodMilliseconds(period uint32) abi.Status {
	if native == nil {
		return abi.StatusUnimplemented
	}
	return native.SetTickPeriod(period)
}

func proxyDefineMetric(kind abi.MetricType, name *byte, ns uint32, id *uint32) abi.Status {
	if native == nil {
		return abi.StatusUnimplemented
	}
	i, st := native.DefineMetric(kind, str(name, ns))
	*id = i
	return st
}

func proxyIncrementMetric(id uint32, offset int64) abi.Status {
	if native == nil {
		return abi.StatusUnimplemented
	}
	return native.IncrementMetric(id, offset)
}

func proxyRecordMetric(id uint32, value uint64) abi.Status {
	if native == nil {
		return abi.StatusUnimplemented
	}
	return native.RecordMetric(id, value)
}

// Native entry points: what a host calls, for tests and benchmarks outside
// Wasm. They are the callbacks exports_wasip1.go exports to a real host.
var Native = nativeEntry{}

type nativeEntry struct{}

func (nativeEntry) VMStart(rootID, size uint32) bool   { return onVMStart(rootID, size) }
func (nativeEntry) Configure(rootID, size uint32) bool { return onConfigure(rootID, size) }
func (nativeEntry) ContextCreate(id, parentID uint32)  { onContextCreate(id, parentID) }
func (nativeEntry) RequestHeaders(id, n uint32, end bool) uint32 {
	return onRequestHeaders(id, n, end)
}
func (nativeEntry) ResponseHeaders(id, n uint32, end bool) uint32 {
	return onResponseHeaders(id, n, end)
}
func (nativeEntry) RequestBody(id, size uint32, end bool) uint32 {
	return onRequestBody(id, size, end)
}
func (nativeEntry) ResponseBody(id, size uint32, end bool) uint32 {
	return onResponseBody(id, size, end)
}
func (nativeEntry) HttpCallResponse(rootID, token, nh, bs, nt uint32) {
	onHttpCallResponse(rootID, token, nh, bs, nt)
}
func (nativeEntry) Tick(rootID uint32)  { onTick(rootID) }
func (nativeEntry) Done(id uint32) bool { return onDone(id) }
func (nativeEntry) Delete(id uint32)    { onDelete(id) }

// randomGet fills buf from the operating system, as WASI random_get does.
func randomGet(buf *byte, size uint32) uint32 {
	if _, err := rand.Read(raw(buf, size)); err != nil {
		return 29 // EIO
	}
	return 0
}

// WallClock is the wall clock (natively, time.Now).
func WallClock() Time { return Time(time.Now().UnixNano()) }
