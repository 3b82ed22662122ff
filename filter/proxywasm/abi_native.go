//go:build !wasip1

package proxywasm

// Outside Wasm there is no host: these stand-ins let the plugin build and its
// pure logic run natively (go vet, unit tests). Every call reports
// Unimplemented; behaviour tests drive the compiled module under wazero.

const statusUnimplemented = 12

func proxyLog(uint32, *byte, uint32) uint32                               { return statusUnimplemented }
func proxyGetBufferBytes(uint32, uint32, uint32, *uint32, *uint32) uint32 { return statusUnimplemented }
func proxyGetHeaderMapValue(uint32, *byte, uint32, *uint32, *uint32) uint32 {
	return statusUnimplemented
}
func proxyGetHeaderMapPairs(uint32, *uint32, *uint32) uint32             { return statusUnimplemented }
func proxyAddHeaderMapValue(uint32, *byte, uint32, *byte, uint32) uint32 { return statusUnimplemented }
func proxyReplaceHeaderMapValue(uint32, *byte, uint32, *byte, uint32) uint32 {
	return statusUnimplemented
}
func proxyRemoveHeaderMapValue(uint32, *byte, uint32) uint32  { return statusUnimplemented }
func proxyGetProperty(*byte, uint32, *uint32, *uint32) uint32 { return statusUnimplemented }
func proxySendLocalResponse(uint32, *byte, uint32, *byte, uint32, *byte, uint32, int32) uint32 {
	return statusUnimplemented
}
func proxyHttpCall(*byte, uint32, *byte, uint32, *byte, uint32, *byte, uint32, uint32, *uint32) uint32 {
	return statusUnimplemented
}
func proxyContinueStream(uint32) uint32                                  { return statusUnimplemented }
func proxySetEffectiveContext(uint32) uint32                             { return statusUnimplemented }
func proxyGetSharedData(*byte, uint32, *uint32, *uint32, *uint32) uint32 { return statusUnimplemented }
func proxySetSharedData(*byte, uint32, *byte, uint32, uint32) uint32     { return statusUnimplemented }
func proxySetTickPeriodMilliseconds(uint32) uint32                       { return statusUnimplemented }
func proxyDefineMetric(uint32, *byte, uint32, *uint32) uint32            { return statusUnimplemented }
func proxyIncrementMetric(uint32, int64) uint32                          { return statusUnimplemented }
func proxyRecordMetric(uint32, uint64) uint32                            { return statusUnimplemented }
