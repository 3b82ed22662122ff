//go:build wasip1 && !tollgate_headers_only && !tollgate_fakehost

package proxywasm

// The body callbacks. Envoy calls an exported one for every chunk of every
// body; the tag tollgate_headers_only builds a module without them (for
// the benchmark that measures what they cost a stream that reads no body,
// and for operators who want that back: no rule whose cost the response
// reports, and no upstream that reads a method override from a form body).
// The response's: for rules whose cost the response reports. The
// request's: for a method override in a form body (a _method field), which
// the filter finds after the headers went on (internal/form).

//go:wasmexport proxy_on_request_body
func proxyOnRequestBody(contextID, bodySize, endOfStream uint32) uint32 {
	r := onRequestBody(contextID, bodySize, endOfStream != 0)
	collectAfterBody(bodySize)
	return r
}

//go:wasmexport proxy_on_response_body
func proxyOnResponseBody(contextID, bodySize, endOfStream uint32) uint32 {
	r := onResponseBody(contextID, bodySize, endOfStream != 0)
	collectAfterBody(bodySize)
	return r
}
