//go:build wasip1 && !tollgate_headers_only

package proxywasm

// The response body callback, for rules whose cost the response reports.
// Envoy calls it for every chunk of every response once it is exported;
// the tag tollgate_headers_only builds a module without it (for the
// benchmark that measures what it costs a stream that reads no body, and
// for operators with no such rules who want that back).

//go:wasmexport proxy_on_response_body
func proxyOnResponseBody(contextID, bodySize, endOfStream uint32) uint32 {
	return onResponseBody(contextID, bodySize, endOfStream != 0)
}
