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
// most one point per level (the classic greedy wildcard walk), and what
// follows a pattern's last "**" is matched against the path's last segments
// at once: a path of n segments costs about n per "**" before the last times
// the (at most maxGlobSegments) pattern segments after it, whatever the
// input.

// maxGlobSegments bounds a pattern's segments (no route needs more): with
// the bytes alone bounded, an outsider's "/**/a/.../a/**/b" of 500 segments
// would cost 500 comparisons per segment of a long path.
const maxGlobSegments = 32

// ValidateGlob checks a path pattern; its error is a *fielderr.Error whose
// caller names the field.
func ValidateGlob(p string) error {
	if !strings.HasPrefix(p, "/") {
		return fielderr.New("", "path pattern must start with '/'")
	}
	if len(p) > 1024 {
		return fielderr.New("", "path pattern is longer than 1024 bytes")
	}
	if strings.Count(p, "/") > maxGlobSegments {
		return fielderr.New("", "path pattern has more than 32 segments")
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
				if !globstarFrom(pattern, pnext) {
					// The last "**": what follows it has a fixed number of
					// segments, which must be the path's last ones. Trying
					// every split instead cost path segments x pattern
					// segments (an outsider's "/**/a/a/.../b" against an
					// 8 KB path: 16 ms a check).
					return matchTail(pattern, pnext, path, si)
				}
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

// globstarFrom reports whether pattern has a "**" segment from offset i on.
func globstarFrom(pattern string, i int) bool {
	for i <= len(pattern) {
		var seg string
		if seg, i = segment(pattern, i); seg == "**" {
			return true
		}
	}
	return false
}

// segments is the number of segments of s from offset i on.
func segments(s string, i int) int {
	if i > len(s) {
		return 0
	}
	return strings.Count(s[i:], "/") + 1
}

// matchTail matches pattern from offset pi (no "**" in it) with the last
// segments of path from offset si on, the segments before them swallowed
// by the "**" that precedes pi.
func matchTail(pattern string, pi int, path string, si int) bool {
	k, n := segments(pattern, pi), segments(path, si)
	if n < k {
		return false
	}
	for range n - k {
		_, si = segment(path, si)
	}
	for pi <= len(pattern) {
		pseg, pnext := segment(pattern, pi)
		sseg, snext := segment(path, si)
		if !matchSegment(pseg, sseg) {
			return false
		}
		pi, si = pnext, snext
	}
	return si > len(path)
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
