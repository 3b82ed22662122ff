package plugin

import (
	"strings"

	"github.com/tollgate-rl/tollgate/shared/paths"
)

// A method override can also come in the query string: Laravel, Symfony
// and Express's method-override (configured for it) route a POST with
// ?_method=DELETE as a DELETE. The filter treats such parameters as it
// treats the override headers: counted under the method they name (and
// refused when they name none, or disagree with each other or with a
// header), or removed before the upstream with method_override: strip.
// One in a form body (Rails, Laravel, Symfony) is beyond a filter that
// decides on the headers: docs/security.md says what that admits.

// maxQueryOverrides is the most _method parameters a query may repeat;
// more are refused as overrides that disagree.
const maxQueryOverrides = 16

// queryOverrides notes every _method parameter of the request's query
// (paths.EachMethodParam).
func (rq *request) queryOverrides() {
	paths.EachMethodParam(rq.rawPath, func(v string) bool {
		if (rq.overrides > 0 || rq.queryOverride > 0) && !strings.EqualFold(v, rq.override) {
			rq.overrideConflict = true
		}
		rq.queryOverride++
		rq.override = v
		// Refused either way past a conflict; and no client repeats the
		// parameter sixteen times (a query of thousands cost the filter
		// a millisecond and more to read).
		if rq.queryOverride >= maxQueryOverrides {
			rq.overrideConflict = true
		}
		return !rq.overrideConflict
	})
}

// withoutMethodParams is the path with its _method parameters removed, the
// rest of it byte for byte: each parameter kept keeps the '&' before it
// (the first one kept follows the '?'), and a query left empty loses its
// '?'. Parameters are split at '&' only, as the frameworks that read
// _method from the query split them (PHP, qs): splitting at ';' too would
// change the value of the parameter before one ("a=1;_method=X" is one
// parameter to them, which they do not read as an override).
func withoutMethodParams(path string) string {
	i := strings.IndexByte(path, '?')
	if i < 0 {
		return path
	}
	out := []byte(path[:i])
	kept := false
	sep := byte('?')
	for q := path[i+1:]; ; {
		param, next, rest := q, byte(0), ""
		if j := strings.IndexByte(q, '&'); j >= 0 {
			param, next, rest = q[:j], q[j], q[j+1:]
		}
		if name, _, _ := strings.Cut(param, "="); !paths.IsMethodParam(name) {
			if !kept {
				sep, kept = '?', true
			}
			out = append(append(out, sep), param...)
		}
		if next == 0 {
			break
		}
		sep, q = next, rest
	}
	return string(out)
}
