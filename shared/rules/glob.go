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
// Both halves run this on every request path, so no part of a pattern is
// tried from more than one place (MatchGlob): a path of n segments costs
// at most n times the pattern's (at most maxGlobSegments) distinct
// segments, whatever the input.

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

// MatchGlob reports whether path matches pattern. The "**" segments cut
// the pattern into sections: the first is matched at the path's start,
// the last (matchTail) at its end, and each between where it first ends
// (findSection): what a "**" swallows is then whatever lies between, and
// the earliest end leaves the most for the sections after it. No section
// is ever tried again from another place.
func MatchGlob(pattern, path string) bool {
	pi, si := 0, 0 // byte offsets of the current segment in pattern and path
	for {
		pseg, pnext := segment(pattern, pi)
		if pseg == "**" {
			break // ("**" is only ever a whole segment: ValidateGlob.)
		}
		if si > len(path) {
			return false
		}
		sseg, snext := segment(path, si)
		if !matchSegment(pseg, sseg) {
			return false
		}
		pi, si = pnext, snext
		if pi > len(pattern) {
			return si > len(path)
		}
	}
	for {
		_, pi = segment(pattern, pi) // past the "**"
		if pi > len(pattern) {
			return true // a last "**" takes the rest, or nothing
		}
		end := doubleStar(pattern, pi)
		if end < 0 {
			// The last section has a fixed number of segments, which
			// must be the path's last ones. Trying every split instead
			// cost path segments x pattern segments (an outsider's
			// "/**/a/a/.../b" against an 8 KB path: 16 ms a check).
			return matchTail(pattern, pi, path, si)
		}
		if end > pi {
			if si = findSection(pattern, pi, end, path, si); si < 0 {
				return false
			}
		}
		pi = end
	}
}

// doubleStar is the offset of the first "**" segment of pattern at or
// after offset i, -1 when there is none.
func doubleStar(pattern string, i int) int {
	for i <= len(pattern) {
		seg, next := segment(pattern, i)
		if seg == "**" {
			return i
		}
		i = next
	}
	return -1
}

// findSection finds where the pattern's segments from offset pi up to the
// "**" at offset end first occur together in path, from offset si on, and
// returns the offset after them (-1: nowhere). It walks the path once,
// keeping in a bit set which of the section's prefixes end at the current
// segment (shift-and), and matches a path segment only against the
// section's distinct segments that could extend one: trying the section
// from every path segment cost path segments x section segments (an
// outsider's "/**/a/.../a/b/**" against a path of 4,096 segments: 2.5 ms a
// check).
func findSection(pattern string, pi, end int, path string, si int) int {
	var segs [maxGlobSegments]string
	var masks [maxGlobSegments]uint64 // which of the section's positions each of segs is at
	distinct, k := 0, 0
	for p := pi; p < end; k++ {
		seg, next := segment(pattern, p)
		i := 0
		for i < distinct && segs[i] != seg {
			i++
		}
		if i == distinct {
			segs[i], distinct = seg, distinct+1
		}
		masks[i] |= 1 << k
		p = next
	}
	last := uint64(1) << (k - 1)
	var prefixes uint64 // bit j: the section's first j+1 segments end here
	for si <= len(path) {
		sseg, snext := segment(path, si)
		extend := prefixes<<1 | 1
		var matched uint64
		for i := range distinct {
			if masks[i]&extend != 0 && matchSegment(segs[i], sseg) {
				matched |= masks[i]
			}
		}
		if prefixes = extend & matched; prefixes&last != 0 {
			return snext
		}
		si = snext
	}
	return -1
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

// matchSegment matches one segment with '*' and '?'. The stars split the
// pattern into chunks of fixed length: the first must begin the segment,
// the last end it, and each between is taken where it first occurs (the
// leftmost place leaves the most for the rest). Backtracking a star at a
// time instead cost pattern bytes x segment bytes (an outsider's
// "/*aaa...ab" of 1 KB against an 8 KB segment: 4 ms a check).
func matchSegment(p, s string) bool {
	i := strings.IndexByte(p, '*')
	if i < 0 {
		return len(p) == len(s) && chunkAt(p, s, 0)
	}
	if !chunkAt(p[:i], s, 0) {
		return false
	}
	s, p = s[i:], p[i+1:]
	for {
		j := strings.IndexByte(p, '*')
		if j < 0 {
			return len(s) >= len(p) && chunkAt(p, s, len(s)-len(p))
		}
		k := index(s, p[:j])
		if k < 0 {
			return false
		}
		s, p = s[k+j:], p[j+1:]
	}
}

// index is where chunk first occurs in s ('?' matching any byte), -1 when
// nowhere: strings.Index for a chunk without '?'; with one, a shift-and
// walk (one bit a chunk byte: each byte of s read once, a word of bits per
// 64 chunk bytes). Trying offsets from the chunk's longest run without '?'
// cost chunk bytes x segment bytes when every other byte is '?' (an
// outsider's 100 such rules: 262 ms a check of an 8 KB path).
func index(s, chunk string) int {
	if strings.IndexByte(chunk, '?') < 0 {
		return strings.Index(s, chunk)
	}
	if len(s) < len(chunk) {
		// Before any table is built: "**" tries a chunk against every
		// segment, most of them shorter (an outsider's 1 KB chunk against
		// 4,000 one-byte segments: 216 ms a check).
		return -1
	}
	// No match starts before the first place its longest run without '?'
	// could sit (and none is anywhere without it: most chunks fail here).
	from := 0
	if run, at := longestRun(chunk); run != "" {
		k := strings.Index(s, run)
		if k < 0 {
			return -1
		}
		from = max(k-at, 0)
	}
	if k := shiftAnd(s[from:], chunk); k >= 0 {
		return from + k
	}
	return -1
}

// shiftAnd is index for a chunk with a '?'.
func shiftAnd(s, chunk string) int {
	m := len(chunk)
	words := (m + 63) / 64
	// masks holds, for each byte the chunk names and last for every other
	// byte, the chunk positions it may stand at: its own and each '?'.
	var slot [256]uint16 // a byte's mask, 1-based; 0: the chunk names it nowhere
	n := 0
	for i := 0; i < m; i++ {
		if c := chunk[i]; c != '?' && slot[c] == 0 {
			n++
			slot[c] = uint16(n)
		}
	}
	masks := make([]uint64, (n+1)*words)
	for i := 0; i < m; i++ {
		bit := uint64(1) << (i % 64)
		if c := chunk[i]; c != '?' {
			masks[int(slot[c])*words+i/64] |= bit
			continue
		}
		for k := 0; k <= n; k++ {
			masks[k*words+i/64] |= bit
		}
	}
	d := make([]uint64, words) // bit i: chunk[:i+1] ends at the byte just read
	last := uint64(1) << ((m - 1) % 64)
	for i := 0; i < len(s); i++ {
		mask := masks[int(slot[s[i]])*words:]
		carry := uint64(1) // a match may start at any byte
		for w := range d {
			next := d[w] >> 63
			d[w] = (d[w]<<1 | carry) & mask[w]
			carry = next
		}
		if d[words-1]&last != 0 {
			return i - m + 1
		}
	}
	return -1
}

// longestRun is chunk's longest piece without '?' and where it starts.
func longestRun(chunk string) (string, int) {
	best, at := "", 0
	for i := 0; i < len(chunk); {
		j := strings.IndexByte(chunk[i:], '?')
		if j < 0 {
			j = len(chunk) - i
		}
		if j > len(best) {
			best, at = chunk[i:i+j], i
		}
		i += j + 1
	}
	return best, at
}

// chunkAt reports whether s holds chunk at offset at, '?' matching any
// byte.
func chunkAt(chunk, s string, at int) bool {
	if at+len(chunk) > len(s) {
		return false
	}
	for i := 0; i < len(chunk); i++ {
		if chunk[i] != '?' && chunk[i] != s[at+i] {
			return false
		}
	}
	return true
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
