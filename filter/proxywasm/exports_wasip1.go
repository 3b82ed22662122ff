//go:build wasip1 && !tollgate_fakehost

package proxywasm

// The callbacks the host calls, proxy-wasm ABI v0.2.1. Booleans and sizes
// cross as i32. The log callback is not exported: Envoy skips a callback a
// module does not export, where an exported no-op would cost a VM call.
// The body callbacks are (exports_body_wasip1.go): a rule whose cost the
// response reports (LLM tokens) reads the response's, a form body's method
// override is read from the request's; every other stream returns from
// them at once (their cost is measured in the filter's benchmarks). A body
// chunk cannot carry a paused request past its decision: the host turns
// the headers' StopIteration into StopAllIterationAndWatermark,
// proxy-wasm-cpp-host's convertVmCallResultToFilterHeadersStatus, so
// Envoy buffers the body and calls no data callback until the filter
// resumes (the development host refuses one, hostmodel.ErrRequestHeld).

//go:wasmexport proxy_abi_version_0_2_1
func proxyABIVersion() {}

//go:wasmexport proxy_on_memory_allocate
func proxyOnMemoryAllocate(size uint32) *byte { return allocate(size) }

//go:wasmexport proxy_on_vm_start
func proxyOnVMStart(rootID, vmConfigSize uint32) uint32 {
	r := b2u(onVMStart(rootID, vmConfigSize))
	collectIfDue()
	return r
}

//go:wasmexport proxy_on_configure
func proxyOnConfigure(rootID, pluginConfigSize uint32) uint32 {
	r := b2u(onConfigure(rootID, pluginConfigSize))
	collectIfDue()
	return r
}

//go:wasmexport proxy_on_context_create
func proxyOnContextCreate(contextID, parentID uint32) {
	onContextCreate(contextID, parentID)
	collectIfDue()
}

//go:wasmexport proxy_on_request_headers
func proxyOnRequestHeaders(contextID, numHeaders, endOfStream uint32) uint32 {
	r := onRequestHeaders(contextID, numHeaders, endOfStream != 0)
	collectIfDue()
	return r
}

//go:wasmexport proxy_on_response_headers
func proxyOnResponseHeaders(contextID, numHeaders, endOfStream uint32) uint32 {
	r := onResponseHeaders(contextID, numHeaders, endOfStream != 0)
	collectIfDue()
	return r
}

//go:wasmexport proxy_on_http_call_response
func proxyOnHttpCallResponse(rootID, token, numHeaders, bodySize, numTrailers uint32) {
	onHttpCallResponse(rootID, token, numHeaders, bodySize, numTrailers)
	collectIfDue()
}

//go:wasmexport proxy_on_tick
func proxyOnTick(rootID uint32) {
	onTick(rootID)
	collectIfDue()
}

//go:wasmexport proxy_on_delete
func proxyOnDelete(contextID uint32) {
	onDelete(contextID)
	collectIfDue()
}

func b2u(b bool) uint32 {
	if b {
		return 1
	}
	return 0
}
