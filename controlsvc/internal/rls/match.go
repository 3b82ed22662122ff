package rls

import "strings"

// Entry is one key and value of a request's descriptor.
type Entry struct{ Key, Value string }

// Find returns the limit a descriptor falls under in domain, or nil, walking
// the tree as envoyproxy/ratelimit does: at each level an entry matches the
// child named "key_value", else the first wildcard child whose pattern
// matches "key_value", else the child named "key" (any value); the limit is
// the one of the node the last entry reaches. A walk that leaves the tree
// early, or ends on a node without a limit, finds none.
func (c *Config) Find(domain string, entries []Entry) *Limit {
	d := c.domains[domain]
	if d == nil {
		return nil
	}
	cur := d
	var found *Limit
	for i, e := range entries {
		full := e.Key + "_" + e.Value
		next := cur.children[full]
		if next == nil {
			for _, w := range cur.wildcards {
				if wildcardMatch(w.parts, full) {
					next = cur.children[w.key]
					break
				}
			}
		}
		if next == nil {
			next = cur.children[e.Key]
		}
		if next == nil {
			return nil
		}
		if i == len(entries)-1 {
			found = next.limit
		}
		if len(next.children) == 0 {
			break
		}
		cur = next
	}
	return found
}

// wildcardMatch reports whether value matches a pattern split at its '*'s:
// the first part is a prefix, the last a suffix, and the middle parts occur
// in order between them, without overlapping.
func wildcardMatch(parts []string, value string) bool {
	if len(parts) == 1 {
		return parts[0] == value
	}
	first, last := parts[0], parts[len(parts)-1]
	if len(value) < len(first)+len(last) || !strings.HasPrefix(value, first) || !strings.HasSuffix(value, last) {
		return false
	}
	rest := value[len(first) : len(value)-len(last)]
	for _, p := range parts[1 : len(parts)-1] {
		i := strings.Index(rest, p)
		if i < 0 {
			return false
		}
		rest = rest[i+len(p):]
	}
	return true
}
