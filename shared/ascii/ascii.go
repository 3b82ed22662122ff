// Package ascii checks short ASCII names (tiers, rule ids, header and claim
// names) against a set of allowed bytes. It replaces regular expressions of
// the form ^[...]{m,n}$, which would pull the regexp package (a quarter of a
// megabyte) into the filter's Wasm module for a few character classes.
package ascii

// Set is a set of bytes.
type Set [256]bool

// NewSet builds a set from a spec of single bytes and ranges, "a-z0-9_.-":
// a '-' that ends the spec (or starts it) stands for itself.
//
// Not inlined: sets are made once, at package init, and each inlined copy
// cost the filter's module about 700 bytes of init code (TestModuleSize).
//
//go:noinline
func NewSet(spec string) *Set {
	var s Set
	for i := 0; i < len(spec); i++ {
		if i+2 < len(spec) && spec[i+1] == '-' {
			for c := int(spec[i]); c <= int(spec[i+2]); c++ {
				s[c] = true
			}
			i += 2
			continue
		}
		s[spec[i]] = true
	}
	return &s
}

// Match reports whether s is minLen..maxLen bytes, all in the set.
func (set *Set) Match(s string, minLen, maxLen int) bool {
	if len(s) < minLen || len(s) > maxLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !set[s[i]] {
			return false
		}
	}
	return true
}

// Printable is every printable ASCII byte, space included (0x20-0x7e).
var Printable = NewSet(" -~")
