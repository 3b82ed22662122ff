package gateway

import (
	"net/http"
	"net/textproto"
	"strings"

	"github.com/tollgate-rl/tollgate/filter/devhost/wasmhost"
)

// Header maps cross between net/http (canonical names, "Content-Type") and
// the filter (lower-case names, as Envoy's HTTP/2 codec and proxy-wasm hand
// them) on every request in both directions. Converting a name allocates;
// the names most requests carry are converted once, here.
var lowerOf, canonicalOf = func() (map[string]string, map[string]string) {
	names := []string{
		"Accept", "Accept-Encoding", "Accept-Language", "Authorization", "Cache-Control", "Connection",
		"Content-Encoding", "Content-Length", "Content-Type", "Cookie", "Date", "Etag", "Host", "Location",
		"Origin", "Referer", "Retry-After", "Server", "Set-Cookie", "Transfer-Encoding", "User-Agent", "Vary",
		"X-Api-Key", "X-Forwarded-For", "X-Forwarded-Proto", "X-Real-Ip", "X-Request-Id",
		"X-Ratelimit-Limit", "X-Ratelimit-Remaining", "X-Ratelimit-Reset", "Ratelimit", "Ratelimit-Policy",
		"X-Tollgate-Identity", "X-Tollgate-Tier", "X-Tollgate-Decision", "X-Tollgate-Token",
	}
	lower, canonical := make(map[string]string, len(names)), make(map[string]string, len(names))
	for _, n := range names {
		l := strings.ToLower(n)
		lower[n], canonical[l] = l, n
	}
	return lower, canonical
}()

// lowerName is a canonical header name in lower case.
func lowerName(name string) string {
	if l, ok := lowerOf[name]; ok {
		return l
	}
	return strings.ToLower(name)
}

// canonicalName is a lower-case header name as net/http keys it.
func canonicalName(name string) string {
	if c, ok := canonicalOf[name]; ok {
		return c
	}
	return textproto.CanonicalMIMEHeaderKey(name)
}

// appendHeaders appends h's fields with lower-case names.
func appendHeaders(dst wasmhost.Headers, h http.Header) wasmhost.Headers {
	for k, vs := range h {
		l := lowerName(k)
		for _, v := range vs {
			dst = append(dst, [2]string{l, v})
		}
	}
	return dst
}

// httpHeaders is h's fields but the pseudo-headers (":path") as net/http
// keys them, every value in one backing array.
func httpHeaders(h wasmhost.Headers) http.Header {
	out := make(http.Header, len(h))
	addHeaders(out, h)
	return out
}

// addHeaders adds h's fields but the pseudo-headers to out.
func addHeaders(out http.Header, h wasmhost.Headers) {
	vals := make([]string, 0, len(h))
	for _, kv := range h {
		if strings.HasPrefix(kv[0], ":") {
			continue
		}
		k := canonicalName(kv[0])
		if prev, ok := out[k]; ok {
			out[k] = append(prev, kv[1]) // a repeat: rare, its own array
			continue
		}
		vals = append(vals, kv[1])
		out[k] = vals[len(vals)-1 : len(vals) : len(vals)]
	}
}
