package paths

import "strings"

// A method override can come in the query string: Laravel, Symfony and
// Express's method-override (configured for it) route a POST with
// ?_method=DELETE as a DELETE. The filter and the rate limit service read
// such parameters the same way, here.

// IsMethodParam reports whether a query parameter's name, as sent, is one
// a framework reads as _method: percent-decoded and read as PHP reads a
// name (leading spaces dropped, however many; cut at a NUL; ' ', '.' and
// '[' as '_'), compared without case (which can only count more).
func IsMethodParam(name string) bool {
	if len(name) < len("_method") {
		return false
	}
	n := strings.TrimLeft(FormUnescape(name), " ")
	if i := strings.IndexByte(n, 0); i >= 0 {
		n = n[:i]
	}
	if len(n) != len("_method") {
		return false
	}
	switch n[0] {
	case '_', ' ', '.', '[':
		return strings.EqualFold(n[1:], "method")
	}
	return false
}

// EachMethodParam calls fn with the value, form-decoded, of every _method
// parameter (IsMethodParam) of rawPath's query, in order, until fn returns
// false (once two disagree, or a query holds more than any client sends:
// the query is the client's, up to Envoy's header limit). Parameters are
// split at '&' and at ';', which some frameworks also take: splitting at
// more than the upstream does can only count more.
func EachMethodParam(rawPath string, fn func(value string) (more bool)) {
	i := strings.IndexByte(rawPath, '?')
	if i < 0 {
		return
	}
	for q := rawPath[i+1:]; q != ""; {
		param := q
		if j := strings.IndexAny(q, "&;"); j >= 0 {
			param, q = q[:j], q[j+1:]
		} else {
			q = ""
		}
		if name, value, _ := strings.Cut(param, "="); IsMethodParam(name) && !fn(FormUnescape(value)) {
			return
		}
	}
}
