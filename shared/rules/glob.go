package rules

import (
	"strings"

	"github.com/tollgate-rl/tollgate/shared/fielderr"
	"github.com/tollgate-rl/tollgate/shared/paths"
)

// Path globs work segment by segment: "**" as a whole segment matches any
// number of segments (none included), "*" matches within one segment, "?"
// matches one byte of a segment. Everything else is literal. "/api/*/users"
// matches "/api/v1/users"; "/api/**" matches "/api" and everything below it.
//
// Both halves run this on every request path, so the matcher backtracks to at
// most one point per level (the classic greedy wildcard walk): its cost is
// bounded by len(pattern)*len(path), whatever the input.

// ValidateGlob checks a path pattern; its error is a *fielderr.Error whose
// caller names the field.
func ValidateGlob(p string) error {
	if !strings.HasPrefix(p, "/") {
		return fielderr.New("", "path pattern must start with '/'")
	}
	if len(p) > 1024 {
		return fielderr.New("", "path pattern is longer than 1024 bytes")
	}
	for seg := range strings.SplitSeq(p, "/") {
		if strings.Contains(seg, "**") && seg != "**" {
			return fielderr.New("", "'**' must be a whole path segment, as in /api/**")
		}
	}
	// Requests are matched in their normalised form (shared/paths): a
	// pattern spelled otherwise ("/items/", "/a//b", "/%69tems") would never
	// match. Wildcards stand in for plain characters while checking.
	literal := []byte(p)
	for i, c := range literal {
		if c == '*' || c == '?' {
			literal[i] = 'x' // a byte loop: strings.Replacer is 20 kB of the filter's module
		}
	}
	if n, err := paths.Normalize(string(literal)); err != nil || n != string(literal) {
		return fielderr.New("", "path pattern must be spelled as requests are normalised: no trailing slash, '//', '.' or '..' segments, ';' parameters or needless escapes")
	}
	return nil
}

// MatchGlob reports whether path matches pattern.
func MatchGlob(pattern, path string) bool {
	pi, si := 0, 0 // byte offsets of the current segment in pattern and path
	starP, starS := -1, -1
	for si <= len(path) {
		if pi <= len(pattern) {
			pseg, pnext := segment(pattern, pi)
			if pseg == "**" {
				starP, starS = pnext, si
				pi = pnext
				continue
			}
			sseg, snext := segment(path, si)
			if matchSegment(pseg, sseg) {
				pi, si = pnext, snext
				continue
			}
		}
		if starP < 0 {
			return false
		}
		// Let the last "**" swallow one more path segment and retry.
		_, starS = segment(path, starS)
		pi, si = starP, starS
	}
	// The path is used up; only "**" segments may remain in the pattern.
	for pi <= len(pattern) {
		pseg, pnext := segment(pattern, pi)
		if pseg != "**" {
			return false
		}
		pi = pnext
	}
	return true
}

// segment returns the segment of s starting at offset i and the offset of the
// next one; past the last segment the next offset is len(s)+1.
func segment(s string, i int) (string, int) {
	if i > len(s) {
		return "", i
	}
	j := strings.IndexByte(s[i:], '/')
	if j < 0 {
		return s[i:], len(s) + 1
	}
	return s[i : i+j], i + j + 1
}

// matchSegment matches one segment with '*' and '?'.
func matchSegment(p, s string) bool {
	pi, si := 0, 0
	star, mark := -1, 0
	for si < len(s) {
		switch {
		case pi < len(p) && (p[pi] == '?' || p[pi] == s[si]):
			pi++
			si++
		case pi < len(p) && p[pi] == '*':
			star, mark = pi, si
			pi++
		case star >= 0:
			mark++
			pi, si = star+1, mark
		default:
			return false
		}
	}
	for pi < len(p) && p[pi] == '*' {
		pi++
	}
	return pi == len(p)
}

// specificity ranks patterns for tie-breaks: more literal bytes first, then
// fewer wildcards. An empty pattern (every path) is the least specific.
func specificity(p string) (literal, wild int) {
	for i := 0; i < len(p); i++ {
		if p[i] == '*' || p[i] == '?' {
			wild++
		} else {
			literal++
		}
	}
	return literal, wild
}
